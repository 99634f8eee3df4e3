"""JSON Schema -> regex trees, or rules of them (recursive or large schemas), keyword by keyword."""
