"""Few-shot question answering over a batch: the shared few-shot prefix is computed once.

Run: .venv/bin/python examples/few_shot_batch.py
"""
import time

import radixlang as rl

EXAMPLES = [("What is the capital of France?", "Paris"), ("What is the capital of Germany?", "Berlin"),
            ("What is the capital of Italy?", "Rome")]
QUESTIONS = ["What is the capital of Spain?", "What is the capital of Japan?",
             "What is the capital of Russia?", "What is the capital of Egypt?",
             "What is the capital of Canada?", "What is the capital of the United Kingdom?"]


@rl.function
def few_shot_qa(s, question):
    s += "The following are questions with answers.\n\n"
    for q, a in EXAMPLES:
        s += f"Q: {q}\nA: {a}\n"
    s += "Q: " + question + "\n"
    s += "A:" + rl.gen("answer", stop="\n", max_tokens=16)


def main() -> None:
    with rl.Runtime() as runtime:
        start = time.perf_counter()
        states = few_shot_qa.run_batch([{"question": q} for q in QUESTIONS], backend=runtime, temperature=0,
                                       progress_bar=True)
        elapsed = time.perf_counter() - start
        for q, state in zip(QUESTIONS, states):
            meta = state.get_meta_info("answer")
            print(f"{q:48} -> {state['answer'].strip():12} (prompt {meta['prompt_tokens']} tokens, "
                  f"{meta['cached_tokens']} from the cache)")
        print(f"{len(QUESTIONS)} programs in {elapsed:.2f} s")


if __name__ == "__main__":
    main()
