"""Constrained decoding: regex, JSON schema and Lark grammar constraints as token masks.

Module map (each file one idea):
- regex_ast, regex_parser: regular-language trees; Python regex text -> tree (stdlib parser).
- automaton: tree -> byte-level DFA: built over code-point classes (alphabet), expanded to UTF-8 (utf8).
- dfa_cache: automata kept by exact content (the trees themselves) per engine, so a repeated language
  (a string pattern with length bounds, "any key but these") is determinized once.
- fsa: automata over abstract symbols: Thompson NFA, subsets, trimming, (incremental) Moore refinement.
- vocab, vocab_trie, token_index: the vocabulary as bytes and as a byte trie (once per vocabulary);
  per DFA state, the tokens it can read (one vectorised trie walk).
- json_schema, rule_grammar: JSON schema -> one regex, or (when recursive or large) rules -> BNF -> an
  LALR(1) table built directly by lr_table;
  schema_merge (keywords, drafts, allOf merging), json_refs ($ref targets), json_objects, json_scalars,
  json_disjoint (oneOf branches that share no value).
- lalr, grammar: LALR tables (Lark's, for Lark grammars) + terminal trees; the incremental parser + lexer
  constraint.
- structural_tag: free text + triggered (begin, JSON schema, end) tags (tool calls) as one language;
  tag_dispatch: a regular tag set glued from per-tag automata kept by content (no joint determinization),
  each built when decoding first reaches its begin; marker_tokens: special tokens that spell a marker.
- matcher: compiled constraints and the per-request Matcher; compiler: params -> constraint (LRU).
- jump_forward: the forced continuation as canonical draft tokens (verified by the scheduler).
"""
