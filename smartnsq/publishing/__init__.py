"""The publish path's pure parts (no asyncio, no sockets), below the Producer: the request
(:mod:`.request`), where it goes (:mod:`.routes`), and its bytes and nsqd's answer
(:mod:`.wire`)."""
