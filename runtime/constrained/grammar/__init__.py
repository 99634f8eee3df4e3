"""Context-free constraints: LALR(1) tables (Lark's, or built from rules) driven by an incremental parser + lexer."""
