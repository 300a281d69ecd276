"""Model directories the pipeline starts from, built offline and cached: the tiny model (:mod:`.tiny`)."""
