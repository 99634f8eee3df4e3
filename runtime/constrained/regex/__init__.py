"""Regular languages: regex text -> trees -> byte-level DFAs (code-point classes, subsets, UTF-8), kept by content."""
