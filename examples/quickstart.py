"""Quickstart: a program with roles, gen, select, streaming, a fork, and its traced IR.

Run: .venv/bin/python examples/quickstart.py   (SmolLM2-135M-Instruct on the CPU; no download)
"""
import radixlang as rl


@rl.function
def assistant_turn(s, question):
    s += rl.system("You are a helpful assistant. Answer in one sentence.")
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=48))
    s += rl.user("Was that answer certain? Reply yes or no.")
    s += rl.assistant(rl.select("certain", choices=["yes", "no"]))


@rl.function
def two_takes(s, topic):
    s += rl.user(f"Write one sentence about {topic}.")
    s += rl.assistant_begin()
    takes = s.fork(2)  # the shared prefix is computed once; both takes decode in parallel
    takes += lambda i: rl.gen("take", max_tokens=32, temperature=0.9)
    takes.join()
    s += rl.assistant_end()


def main() -> None:
    with rl.Runtime() as runtime:  # an in-process engine; rl.Endpoint(url) talks to a server instead
        rl.set_default_backend(runtime)

        state = assistant_turn.run(question="What is the capital of France?", temperature=0)
        print("answer: ", state["answer"])
        print("certain:", state["certain"], state.get_meta_info("certain")["normalized_prompt_logprobs"])
        print("messages:", state.messages())

        print("streaming: ", end="")
        stream = assistant_turn.run(question="Why is the sea salty?", stream=True, temperature=0)
        for chunk in stream.text_iter("answer"):
            print(chunk, end="", flush=True)
        print()

        print("takes:", two_takes.run(topic="the moon")["take"])

        ir = assistant_turn.trace()  # a JSON-serializable program; a server can run it too
        print("IR params:", ir.params, "ops:", len(ir.ops))
        again = rl.interpret(rl.ProgramIR.from_json(ir.to_json()), {"question": "What is 2 + 2?"}, temperature=0)
        print("from IR:", again["answer"])


if __name__ == "__main__":
    main()
