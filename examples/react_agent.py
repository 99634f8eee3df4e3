"""A ReAct-style agent: the model picks an action, Python runs the tool, the observation goes back in.

Run: .venv/bin/python examples/react_agent.py
"""
import ast
import operator

import radixlang as rl

FACTS = {  # a stand-in knowledge base for the "lookup" tool
    "eiffel tower": "The Eiffel Tower is 330 metres tall and stands in Paris.",
    "mount everest": "Mount Everest is 8849 metres tall.",
    "python": "Python is a programming language created by Guido van Rossum.",
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    def walk(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        raise ValueError("only numbers and + - * / are allowed")
    try:
        return str(walk(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


def lookup(term: str) -> str:
    term = term.strip().strip("\"'.").lower()
    return next((fact for key, fact in FACTS.items() if key in term or term in key), "no entry found")


TOOLS = {"lookup": lookup, "calculate": calculate}


@rl.function
def react(s, question, max_steps=4):
    s += ("Answer the question by thinking step by step. Use the actions lookup[term] and calculate[expression], "
          "then finish[answer].\n\n")
    s += "Question: How tall is the Eiffel Tower in centimetres?\n"
    s += "Thought: I need the height of the Eiffel Tower.\nAction: lookup[eiffel tower]\n"
    s += f"Observation: {FACTS['eiffel tower']}\n"
    s += "Thought: 330 metres is 330 * 100 centimetres.\nAction: calculate[330 * 100]\nObservation: 33000\n"
    s += "Thought: I know the answer.\nAction: finish[33000 centimetres]\n\n"
    s += "Question: Who created Python?\n"
    s += "Thought: I need to look up Python.\nAction: lookup[python]\n"
    s += f"Observation: {FACTS['python']}\n"
    s += "Thought: I know the answer.\nAction: finish[Guido van Rossum]\n\n"
    s += "Question: " + question + "\n"
    for _ in range(max_steps):
        s += "Thought:" + rl.gen("thought", max_tokens=40, stop="\n") + "\n"
        s += "Action: " + rl.select("action", ["lookup", "calculate", "finish"]) + "["
        if s["action"] == "lookup":  # Python control flow on generated values: fine when running eagerly
            s += rl.select("argument", sorted(FACTS))  # only terms the knowledge base has
        else:
            s += rl.gen("argument", max_tokens=24, stop=["]", "\n"])
        s += "]\n"
        if s["action"] == "finish":
            return s["argument"]
        s += f"Observation: {TOOLS[s['action']](s['argument'])}\n"
    return None


def main() -> None:
    with rl.Runtime() as runtime:
        state = react.run(question="How tall is Mount Everest in centimetres?", backend=runtime, temperature=0)
        print(state.text())
        print("final answer:", state.ret_value)


if __name__ == "__main__":
    main()
