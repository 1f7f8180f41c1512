"""The coordinator: the HTTP API for clients and runners, over the durable store."""
