"""Reference loaders that specbind is measured against (not used by specbind itself)."""
