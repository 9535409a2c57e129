"""Jinja features one by one: nibble's interpreter against jinja2 configured as transformers
configures it for chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False)). Each case renders to the same text."""
import json
import subprocess

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest

CASES = [
    ("{{ 'a' ~ 1 ~ none ~ true }}", {}),
    ("{{ [1, 'x', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }}", {}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 10 / 4 }}", {}),
    ("{{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e20 }} {{ 3.0 }} {{ -0.5 }}", {}),
    ("{% for x in items %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}", {"items": [3, 4, 5]}),
    ("{% for x in items if x > 1 %}{{ loop.index0 }}:{{ x }} {% else %}none{% endfor %}", {"items": [1, 2, 3]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     {"xs": [1, 2, 3, 4, 5]}),
    ("{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::2] }} {{ 'hello'[1:3] }} {{ 'abc'[::-1] }} {{ xs[-1] }}",
     {"xs": [1, 2, 3, 4]}),
    ("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("{% macro m(a, b='d') %}<{{ a }}|{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='e') }}{{ m('x', 'y') }}", {}),
    ("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inside{% endcall %}", {}),
    ("{% filter upper %}shout {{ 'me' }}{% endfilter %}", {}),
    ("{% filter replace('a', 'o') | upper %}banana{% endfilter %}|{% filter indent(2) %}x\ny{% endfilter %}", {}),
    ("{% set x | trim | upper %}  spaced  {% endset %}[{{ x }}]", {}),
    ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} {{ 'a' is string }} {{ d is mapping }}"
     " {{ xs is iterable }} {{ 3 is number }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ x is not none }}",
     {"x": 1, "d": {}, "xs": []}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}", {}),
    ("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ s | tojson }} {{ [1.0, 2e-7, none, false] | tojson }}",
     {"d": {"z": [1, {"y": "ü\n\"q\""}], "a": None}, "s": "tab\there"}),
    ("{{ d | tojson(sort_keys=true) }}", {"d": {"b": 1, "a": {"d": 2, "c": 3}}}),
    ("[{{ '  x  ' | trim }}] {{ xs | length }} {{ 'ab' | upper }} {{ 'AB' | lower }} {{ 'aXbX' | replace('X', '-') }}",
     {"xs": [1, 2]}),
    ("{{ xs | join(', ') }} {{ xs | first }} {{ xs | last }} {{ 'abc' | list }} {{ xs | unique | list }}",
     {"xs": [3, 1, 3, 2]}),
    ("{{ y | default('dflt') }} {{ '' | default('empty', true) }} {{ none | default('n') }}", {}),
    ("{{ users | map(attribute='name') | join('/') }} {{ users | selectattr('admin') | map(attribute='name') | list }}"
     " {{ users | rejectattr('admin') | list | length }} {{ nums | select('odd') | list }} {{ nums | reject('even') | list }}",
     {"users": [{"name": "a", "admin": True}, {"name": "b", "admin": False}], "nums": [1, 2, 3, 4]}),
    ("{{ users | selectattr('age', 'gt', 20) | map(attribute='name') | list }}",
     {"users": [{"name": "a", "age": 30}, {"name": "b", "age": 10}]}),
    ("{{ text | indent(2) }}|{{ text | indent(4, true) }}|{{ 'x\n\ny' | indent(2, blank=true) }}",
     {"text": "line1\nline2\n\nline4"}),
    ("{{ 42 | string }}{{ '7' | int + 1 }}{{ 'x' | int }}{{ 3.9 | int }}", {}),
    ("{{ s.startswith('he') }} {{ s.endswith('lo') }} {{ s.split('l') }} {{ ' a b  c '.split() }} {{ s.upper() }}"
     " {{ '--x--'.strip('-') }} {{ '\n\nx\n'.lstrip('\n') }} {{ 'x  '.rstrip() }} {{ s.replace('l', 'L') }}",
     {"s": "hello"}),
    ("{{ 'a</think>b'.split('</think>')[-1] }} {{ 'a,b,c'.split(',', 1) }} {{ s.title() }} {{ s.capitalize() }}",
     {"s": "hello world"}),
    ("{{ d.get('a') }} {{ d.get('zz', 'fallback') }} {{ d.keys() | list }} {{ d.values() | list }}", {"d": {"a": 1, "b": 2}}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a and not b %}none{% endif %}", {"b": 1}),
    ("{{ 'yes' if x else 'no' }} {{ x or 'fallback' }} {{ x and 'both' }} {{ 0 or '' or 'last' }}", {"x": 0}),
    ("  {% if true %}\n  indented\n  {% endif %}\n{%- if true -%}   tight   {%- endif -%}\n  end", {}),
    ("{# comment #}\n{% for i in range(2) %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("{%+ if true %}kept{% endif %}\n  {%- if true +%}\nx{% endif %}", {}),
    ("{{ messages | length }}{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% endfor %}", {}),
    ("{{ range(5) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}", {}),
    ("{{ ['b', 'a', 'c'] | sort }} {{ ['b', 'a'] | sort(reverse=true) }} {{ [3, 1] | max }} {{ [3, 1] | min }}"
     " {{ [1, 2, 3] | sum }}", {}),
    ("{{ 'x' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ (1, 2) }} {{ -3 | abs }}", {}),
    ("{{ raise_exception('stop: ' ~ reason) }}", {"reason": "bad"}),
    ("{{ undefined_thing.attr }}", {}),
]


def jinja2_render(source, variables):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return {"prompt": env.from_string(source).render(messages=[], **variables)}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def nibble_render(build_dir, tmp_path, source, variables):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "chat_template.jinja").write_text(source)
    request = {"messages": [], "chat_template_kwargs": variables}
    proc = subprocess.run([str(build_dir / "tests/chat_tool"), str(model)], input=json.dumps(request) + "\n",
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr}
    return json.loads(proc.stdout)


def assert_renders_like_jinja2(build_dir, tmp_path, source, variables):
    """The same text as jinja2, or an error where jinja2 raises one."""
    expected = jinja2_render(source, variables)
    got = nibble_render(build_dir, tmp_path, source, variables)
    if "error" in expected:
        assert "error" in got, f"jinja2 raised {expected['error']!r}; nibble gave {got!r}"
    else:
        assert got == expected


@pytest.mark.parametrize("source,variables", CASES, ids=[str(i) for i in range(len(CASES))])
def test_feature_matches_jinja2(build_dir, tmp_path, source, variables):
    assert_renders_like_jinja2(build_dir, tmp_path, source, variables)


HOSTILE = [
    ("{{ " + "(" * 500 + "1" + ")" * 500 + " }}", "nested too deeply"),
    ("{% if true %}" * 300 + "x" + "{% endif %}" * 300, "nested too deeply"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses too deeply"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "too many steps"),
    ("{{ 'x' * 100000000 }}", "too large"),
    ("{{ xs[] }}", "empty subscript"),
]


@pytest.mark.parametrize("source,message", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_templates_fail_cleanly(build_dir, tmp_path, source, message):
    """Bounds jinja2 leaves to Python's recursion limit (or to the user's patience) are errors here."""
    got = nibble_render(build_dir, tmp_path, source, {"xs": [1]})
    assert "error" in got and message in got["error"], got
