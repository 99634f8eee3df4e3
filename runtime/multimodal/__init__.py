"""Images for vision-language models: sources -> checked images -> pixels -> embeddings, and their place in a prompt."""
