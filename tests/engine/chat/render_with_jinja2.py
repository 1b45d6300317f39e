#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2, the way Hugging Face transformers' apply_chat_template does
(ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; tojson as json.dumps
without HTML escaping, keeping key order; raise_exception and strftime_now), so that
chat_template_test can compare the C++ rendering with it byte for byte.

Usage: render_with_jinja2.py CASES.json OUT
CASES.json: a list of {"template": path, "messages": [...], "add_generation_prompt": bool, "bos_token": str,
"eos_token": str, "now": [y, m, d, H, M, S], optional "enable_thinking": bool}.
OUT receives, per case in order, "OK <n>\\n" or "ERROR <n>\\n" followed by n bytes: the rendered text, or
the message raise_exception was given (other errors are reported as "ERROR" with their text).
"""
import datetime
import json
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def render(case, templates):
    path = case["template"]
    if path not in templates:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        with open(path, encoding="utf-8") as f:
            templates[path] = env.from_string(f.read())
    now = datetime.datetime(*case["now"])
    kwargs = dict(messages=case["messages"], tools=None, add_generation_prompt=case["add_generation_prompt"],
                  bos_token=case["bos_token"], eos_token=case["eos_token"],
                  strftime_now=lambda fmt: now.strftime(fmt))
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    return templates[path].render(**kwargs)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    templates = {}
    with open(sys.argv[2], "wb") as out:
        for case in cases:
            try:
                status, text = "OK", render(case, templates)
            except Raised as e:
                status, text = "ERROR", str(e)
            except jinja2.TemplateError as e:
                status, text = "ERROR", "jinja2: " + str(e)
            data = text.encode("utf-8")
            out.write(f"{status} {len(data)}\n".encode("ascii") + data)


if __name__ == "__main__":
    main()
