"""Contracts shared by every part: the client protocol, the Redis registry, API keys."""
