"""Storage: files written whole, the datastore (manifest, memmaps, SQLite, writer lock), its checksums, and a
sharded datastore read as one. Knows nothing of the model."""
