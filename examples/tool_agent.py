"""A tool-calling agent: two Python tools, calls valid for their schemas by construction, a loop that
runs each call here and hands the results back until the model answers in text.

Run: .venv/bin/python examples/tool_agent.py   (SmolLM2-135M-Instruct on the CPU; no download)

Each turn is `gen("call", tools=..., tool_choice=...)`: a structural tag lets the model write text or
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and inside a call only a listed tool's name
and arguments that match its signature can come out. `state["call"]` holds the parsed calls;
`rl.tool_results` runs the Python functions and returns the text of their results for the next turn.
"""
import radixlang as rl

CITIES = {"paris": 18, "oslo": 4, "cairo": 31}


def get_temperature(city: str) -> dict:
    """The current temperature in a city, in degrees Celsius."""
    return {"city": city, "celsius": CITIES.get(city.strip().lower())}


def celsius_to_fahrenheit(celsius: float) -> float:
    """Converts a temperature from degrees Celsius to degrees Fahrenheit."""
    return round(celsius * 9 / 5 + 32, 1)


TOOLS = [get_temperature, celsius_to_fahrenheit]


@rl.function
def turn(s, messages, choice):
    for role, text in messages:  # the conversation so far: the radix cache keeps its KV between turns
        s += getattr(rl, role)(text)
    s += rl.assistant(rl.gen("call", tools=TOOLS, tool_choice=choice, max_tokens=96, temperature=0))


def agent(question: str, max_turns: int = 4) -> tuple[list[dict], str]:
    """Loops until the model answers without calling a tool (the first turn must call one)."""
    messages = [("system", rl.tools_prompt(TOOLS)), ("user", question)]
    calls_made: list[dict] = []
    for i in range(max_turns):
        state = turn.run(messages=messages, choice="required" if i == 0 else "auto")
        reply = state.messages()[-1]["content"]
        if not state["call"]:
            return calls_made, reply
        calls_made += state["call"]
        messages += [("assistant", reply), ("user", rl.tool_results(state["call"], TOOLS))]
    return calls_made, "(no answer within the turn limit)"


def main() -> None:
    with rl.Runtime() as runtime:
        rl.set_default_backend(runtime)
        calls, answer = agent("What is the temperature in Oslo right now?")
        for call in calls:
            print(f"call: {call['name']}({call['arguments']})")
        print("answer:", answer)


if __name__ == "__main__":
    main()
