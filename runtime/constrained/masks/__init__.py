"""The vocabulary as bytes and as a byte trie; per DFA state, the tokens it can read (vectorised walks)."""
