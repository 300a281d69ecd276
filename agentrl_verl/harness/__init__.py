"""The demo: ``agentrl-verl demo`` (:mod:`.demo`) and the CPU thread settings of its processes (:mod:`.threads`)."""
