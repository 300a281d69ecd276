"""Docker sandboxes for container tasks: image building (:mod:`.images`) and the container pool (:mod:`.containers`)."""
