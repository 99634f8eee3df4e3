"""JSON extraction: fill a fixed JSON skeleton from free text, one field at a time.

Strings are generated up to their closing quote, enumerations are picked with select, and Python
checks the result with json.loads. With constrained decoding, `rl.gen(json_schema=...)` or
`rl.gen(regex=...)` can produce the whole object in one call instead.

Run: .venv/bin/python examples/json_extraction.py
"""
import json

import radixlang as rl

DOCUMENTS = [
    "Maria Lopez, 34, is a software engineer in Madrid. She enjoys climbing and chess.",
    "Kenji Watanabe is a 58 year old chef who runs a noodle shop in Osaka.",
    "At 21, Amara Okafor studies medicine in Lagos and plays the violin.",
]


@rl.function
def extract_person(s, document):
    s += rl.user("Extract the person described in this text as JSON.\n\nText: " + document)
    with s.assistant():
        s += '{\n  "name": "' + rl.gen("name", max_tokens=16, stop='"') + '",\n'
        s += '  "age": ' + rl.gen("age", max_tokens=4, stop=[",", "\n"]) + ',\n'
        s += '  "city": "' + rl.gen("city", max_tokens=12, stop='"') + '",\n'
        s += '  "field": "' + rl.select("field", ["technology", "food", "medicine", "arts"]) + '"\n}'


def main() -> None:
    with rl.Runtime() as runtime:
        states = extract_person.run_batch([{"document": d} for d in DOCUMENTS], backend=runtime, temperature=0)
        for document, state in zip(DOCUMENTS, states):
            text = state.messages()[-1]["content"]
            try:
                print(json.dumps(json.loads(text)), "<-", document)
            except json.JSONDecodeError as e:
                print(f"not valid JSON ({e}):", text)


if __name__ == "__main__":
    main()
