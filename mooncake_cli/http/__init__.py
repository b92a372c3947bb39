"""The HTTP stack of every role: server, bounds, middleware, client, auth, audit, metrics."""
