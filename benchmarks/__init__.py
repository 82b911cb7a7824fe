"""``python -m benchmarks`` and its baselines: specbind measured beside what a user would write.

``main`` is the command; ``common`` is what every bench module shares (imported by them, never
importing them); ``baselines/`` holds the hand-written loaders the rows compare against.
"""
