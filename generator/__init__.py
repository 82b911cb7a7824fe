"""specbind's generator: YAML specs -> validated model -> Jinja -> ``generated/``."""
