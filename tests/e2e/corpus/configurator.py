"""Command-line overrides for a script's module-level settings, exec'd by the script itself:

    python nanogpt_configurator.py [config_file.py] [--key=value ...]

A word without ``=`` names a Python file that is exec'd over the defaults; each ``--key=value``
replaces one existing global, its value read as a Python literal where it is one (else kept as a
string), and it must keep the default's type.
"""

import sys
from ast import literal_eval

for _word in sys.argv[1:]:
    if "=" not in _word:
        if _word.startswith("--"):
            raise SystemExit(f"{_word}: overrides are written --key=value")
        print(f"reading settings from {_word}")
        with open(_word) as _f:
            exec(_f.read())
        continue
    _key, _text = _word.removeprefix("--").split("=", 1)
    if _key not in globals():
        raise SystemExit(f"unknown setting: {_key}")
    try:
        _value = literal_eval(_text)
    except (SyntaxError, ValueError):
        _value = _text
    if type(_value) is not type(globals()[_key]):
        raise SystemExit(f"{_key}: {_value!r} is not a {type(globals()[_key]).__name__}")
    print(f"setting {_key} = {_value!r}")
    globals()[_key] = _value
