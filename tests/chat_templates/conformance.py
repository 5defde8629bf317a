#!/usr/bin/python3
"""Byte-for-byte conformance of glm_jinja (glm-jinja-render) with Python's jinja2 configured the
way transformers' apply_chat_template configures it.

Cases:
  templates/*.jinja x messages/*.json   every template with every context (a context is the JSON
                                        object handed to render: messages, tools,
                                        add_generation_prompt, bos_token, ..., and any
                                        chat_template_kwargs flattened in, as transformers does)
  snippets.json                         [{"name", "template", "context"}]: small feature cases
  expected/<template>__<messages>.txt   a fixed expected rendering, checked against both sides

A case passes when both sides render the same bytes, or both fail (a raise_exception, an
undefined attribute, ...): error messages are not compared. strftime_now uses a fixed clock on
both sides (--now). Prints a unified diff for each mismatch and a closing summary line; exits 1
on any mismatch, 77 when jinja2 is missing.

  conformance.py --render build/.../glm-jinja-render --dir tests/chat_templates
"""
import argparse
import datetime
import difflib
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3-jinja2 is not installed")
    sys.exit(77)

ERROR = object()


def make_environment(now):
    """transformers.utils.chat_template_utils._compile_jinja_template, with a fixed clock."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja2's tojson (which HTML-escapes) with plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(now).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_python(env, source, context):
    try:
        return env.from_string(source).render(**context)
    except Exception as e:  # noqa: BLE001 - any jinja2/Python error counts as "error"
        return (ERROR, f"{type(e).__name__}: {e}")


def render_ours(render, template_path, context, now, tmpdir):
    context_path = os.path.join(tmpdir, "context.json")
    with open(context_path, "w", encoding="utf-8") as f:
        json.dump(context, f, ensure_ascii=False)
    proc = subprocess.run([render, template_path, context_path, f"--now={now}"],
                          capture_output=True, timeout=60)
    if proc.returncode == 1:
        return (ERROR, proc.stderr.decode("utf-8", "replace").strip())
    if proc.returncode != 0:
        return (ERROR, f"glm-jinja-render exited {proc.returncode}: "
                       f"{proc.stderr.decode('utf-8', 'replace').strip()}")
    return proc.stdout.decode("utf-8")


def show(result):
    if isinstance(result, tuple):
        return f"<error: {result[1]}>"
    return result


def compare(name, python, ours, expected=None):
    """Returns a list of failure descriptions (empty when the case passes)."""
    failures = []
    py_err = isinstance(python, tuple)
    our_err = isinstance(ours, tuple)
    if py_err and our_err:
        pass
    elif py_err != our_err or python != ours:
        diff = "".join(difflib.unified_diff(
            show(python).splitlines(keepends=True), show(ours).splitlines(keepends=True),
            fromfile=f"{name} (python jinja2)", tofile=f"{name} (glm_jinja)"))
        failures.append(f"MISMATCH {name}\n{diff}\n  python: {show(python)!r}\n  ours:   {show(ours)!r}")
    if expected is not None:
        for side, result in (("python jinja2", python), ("glm_jinja", ours)):
            if result != expected:
                failures.append(f"EXPECTED-OUTPUT MISMATCH {name} ({side})\n"
                                f"  expected: {expected!r}\n  got:      {show(result)!r}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render", required=True, help="path to glm-jinja-render")
    parser.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--now", type=int, default=1735689600 + 14 * 86400 + 3600 * 13,
                        help="epoch seconds strftime_now sees")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    args = parser.parse_args()

    env = make_environment(args.now)
    templates = sorted(glob.glob(os.path.join(args.dir, "templates", "*.jinja")))
    message_sets = sorted(glob.glob(os.path.join(args.dir, "messages", "*.json")))
    failures = []
    if not templates or not message_sets:
        failures.append(f"no templates/*.jinja or messages/*.json under {args.dir}")
    num_cases = 0
    num_errors = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for template_path in templates:
            with open(template_path, encoding="utf-8") as f:
                source = f.read()
            tname = os.path.basename(template_path)[: -len(".jinja")]
            for messages_path in message_sets:
                mname = os.path.basename(messages_path)[: -len(".json")]
                name = f"{tname}__{mname}"
                if args.k not in name:
                    continue
                with open(messages_path, encoding="utf-8") as f:
                    context = json.load(f)
                python = render_python(env, source, context)
                ours = render_ours(args.render, template_path, context, args.now, tmpdir)
                expected = None
                expected_path = os.path.join(args.dir, "expected", name + ".txt")
                if os.path.exists(expected_path):
                    with open(expected_path, encoding="utf-8", newline="") as f:
                        expected = f.read()
                    if expected.endswith("\n"):
                        expected = expected[:-1]  # the file's own final newline
                num_cases += 1
                num_errors += isinstance(python, tuple)
                failures += compare(name, python, ours, expected)

        snippets_path = os.path.join(args.dir, "snippets.json")
        if os.path.exists(snippets_path):
            with open(snippets_path, encoding="utf-8") as f:
                snippets = json.load(f)
            snippet_file = os.path.join(tmpdir, "snippet.jinja")
            for i, snippet in enumerate(snippets):
                name = f"snippet[{i}] {snippet.get('name', '')}"
                if args.k not in name:
                    continue
                with open(snippet_file, "w", encoding="utf-8", newline="") as f:
                    f.write(snippet["template"])
                context = snippet.get("context", {})
                python = render_python(env, snippet["template"], context)
                ours = render_ours(args.render, snippet_file, context, args.now, tmpdir)
                num_cases += 1
                num_errors += isinstance(python, tuple)
                failures += compare(name, python, ours, snippet.get("expected"))

    for failure in failures:
        print(failure)
        print()
    status = "FAIL" if failures else "OK"
    print(f"{status}: {num_cases} cases ({num_errors} expected errors), "
          f"{len(failures)} mismatches, jinja2 {jinja2.__version__}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
