"""One module per CLI verb (see ringtune.cli)."""
