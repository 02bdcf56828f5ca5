"""The one I/O core every read of a checkpoint goes through: the request planner that
knows the storage (:mod:`.requests`), the windowed executor that runs requests in flight
(:mod:`.window`), the host buffers they land in (:mod:`.buffers`), and whole-file
transfers on top of them (:mod:`.transfer`)."""
