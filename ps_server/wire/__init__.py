"""The wire contract: generated messages, zero-copy codecs, table specs and stats."""
