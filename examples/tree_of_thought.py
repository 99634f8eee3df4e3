"""Tree of thought: fork into several lines of reasoning, then judge and answer from them.

Run: .venv/bin/python examples/tree_of_thought.py
"""
import radixlang as rl


@rl.function
def tree_of_thought(s, question, branches=3):
    s += rl.system("You are a thoughtful assistant.")
    s += rl.user(question)
    s += rl.assistant_begin()
    thoughts = s.fork(branches)  # each branch extends the same cached prefix, in parallel
    thoughts += "One idea:" + rl.gen("idea", max_tokens=40, stop="\n", temperature=0.9)
    for i, branch in enumerate(thoughts):  # a second level: each idea gets a critique
        branch += "\nA weakness of this idea: " + rl.gen("critique", max_tokens=30, stop="\n", temperature=0.7)
    thoughts.join()
    s += "Ideas I considered:\n"
    for i, (idea, critique) in enumerate(zip(s["idea"], s["critique"])):
        s += f"{i + 1}. {idea.strip()}\n   Weakness: {critique.strip() or 'none found'}\n"
    s += "The most practical idea is number " + rl.select("best", [str(i + 1) for i in range(branches)]) + ". "
    s += "In short, my advice is to" + rl.gen("answer", max_tokens=60, stop="\n", temperature=0)
    s += rl.assistant_end()


def main() -> None:
    with rl.Runtime() as runtime:
        state = tree_of_thought.run(question="How can I sleep better?", backend=runtime)
        print(state.messages()[-1]["content"])


if __name__ == "__main__":
    main()
