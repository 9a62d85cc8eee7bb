"""CLI commands, one module per group; each exposes `register(app)`."""
