"""Constrained decoding: regex, JSON schema and Lark grammar constraints as token masks.

Four sub-packages, lowest first, then the constraint API at this level (each file one idea):
- regex/: regex_ast, regex_parser (regular-language trees; Python regex text -> tree, stdlib parser);
  automaton (tree -> byte-level DFA: built over code-point classes (alphabet), expanded to UTF-8 (utf8));
  fsa (automata over abstract symbols: Thompson NFA, subsets, trimming, (incremental) Moore refinement);
  dfa_cache (automata kept by exact content per engine, so a repeated language is determinized once).
- masks/: vocab, vocab_trie, token_index: the vocabulary as bytes and as a byte trie (once per
  vocabulary); per DFA state, the tokens it can read (one vectorised trie walk).
- grammar/: lalr (LALR tables: Lark's for Lark grammars, + terminal trees; forks where a rule grammar's
  table keeps two reductions), lr_table (an LALR(1) table built directly from BNF), rule_grammar (rules of regex trees -> BNF), constraint (the incremental
  parser + lexer constraint).
- jsonschema/: json_schema (JSON schema -> one regex, or (when recursive or large) rules for grammar/);
  schema_merge (keywords, drafts, allOf merging), json_refs ($ref targets), json_objects, json_arrays,
  json_scalars, json_scalar_schemas, json_combinators, json_not, json_unions, json_types,
  json_disjoint / json_required_choice (oneOf branches that share no value).
- structural_tag: free text + triggered (begin, JSON schema, end) tags (tool calls) as one language;
  tag_dispatch: a regular tag set glued from per-tag automata kept by content (no joint determinization),
  each built when decoding first reaches its begin; marker_tokens: special tokens that spell a marker.
- matcher: compiled constraints and the per-request Matcher; compiler: params -> constraint (LRU).
- jump_forward: the forced continuation as canonical draft tokens (verified by the scheduler).
"""
