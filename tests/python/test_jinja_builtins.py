"""Every jinja2 built-in a chat template can reach — filters, tests, globals, and the str / list /
dict methods the immutable sandbox allows — rendered by nibble and by jinja2 (configured as
transformers configures it). The inventory tests read jinja2's own tables and Python's dir(), so a
built-in nibble has not covered fails here; the few nibble refuses must fail with an error naming them."""
import jinja2.defaults
import jinja2.filters
import jinja2.tests
import pytest

from test_jinja_features import assert_renders_like_jinja2, nibble_render

USERS = {"users": [{"name": "bo", "age": 30, "city": "b"}, {"name": "al", "age": 10, "city": "A"},
                   {"name": "cy", "age": 20, "city": "B"}, {"name": "di", "age": 30, "city": "a"}]}

FILTERS = {
    "abs": ["{{ -3|abs }} {{ -2.5|abs }} {{ 4|abs }} {{ true|abs }}"],
    "attr": ["{% set ns = namespace(a=1) %}{{ ns|attr('a') }}|{{ {'a': 1}|attr('a') }}|{{ ({'a': 1}|attr('items'))()|list }}"
             "|{{ 'abc'|attr('upper') is callable }}"],
    "batch": ["{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} {{ []|batch(3)|list }}"],
    "capitalize": ["{{ 'hELLO wORLD'|capitalize }} {{ 'ß x'|capitalize }}"],
    "center": ["[{{ 'ab'|center(7) }}][{{ 'abc'|center(6) }}][{{ 'x'|center }}][{{ 'long'|center(2) }}]"],
    "count": ["{{ [1, 2]|count }} {{ 'héllo'|count }} {{ {'a': 1}|count }}"],
    "d": ["{{ y|d('dflt') }} {{ ''|d('empty', true) }} {{ 0|d(5) }}"],
    "default": ["{{ y|default('dflt') }} {{ ''|default('empty', true) }} {{ none|default('n') }} {{ y|default }}|"],
    "dictsort": ["{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }} {{ e|dictsort }}"
                 " {{ e|dictsort(true) }} {{ {'b': 1, 'a': 2}|dictsort }}",
                 "{{ d|dictsort(by='nope') }}"],
    "e": ["{{ s|e }}"],
    "escape": ["{{ s|escape }} {{ 5|escape }}"],
    "filesizeformat": ["{{ 1|filesizeformat }} {{ 300|filesizeformat }} {{ 1500|filesizeformat }}"
                       " {{ 1048576|filesizeformat(true) }} {{ 3e12|filesizeformat }} {{ '2500'|filesizeformat }}"],
    "first": ["{{ [3, 1]|first }} {{ 'abc'|first }} {{ {'a': 1, 'b': 2}|first }} [{{ []|first }}]"],
    "float": ["{{ '3.5'|float }} {{ 'x'|float }} {{ 'x'|float(1.5) }} {{ 2|float }} {{ true|float }} {{ ' 1e3 '|float }}"],
    "forceescape": ["{{ s|forceescape }}"],
    "format": ["{{ '%05.1f|%s|%d|%x|%-4s|%r'|format(3.14159, 'a', 7.9, 255, 'b', 'q') }}",
               "{{ '%(a)s-%(b)03d'|format(a='x', b=5) }} {{ '%s'|format([1, 2]) }} {{ '%%|%5s|%-5d|'|format('r', 3) }}",
               "{{ '%+d %+.2e %g %G %5.2f%%'|format(5, 12345.678, 0.0001, 1e20, 2.5) }} {{ '%c%c'|format(65, 'b') }}",
               "{{ '%#x %#o %X %i %.3s %e'|format(255, 8, 255, -4, 'abcdef', 0.5) }}",
               "{{ '%d'|format('x') }}", "{{ '%s %s'|format(1) }}", "{{ '%s'|format(1, 2) }}"],
    "groupby": ["{% for g in users|groupby('city') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join(',') }};{% endfor %}",
                "{{ users|groupby('city')|map(attribute='grouper')|list }} {{ users|groupby('age')|first }}",
                "{% for city, items in users|groupby('city', case_sensitive=true) %}{{ city }}={{ items|length }} {% endfor %}"
                "{% for g in users|groupby('zone', default='none') %}{{ g[0] }}/{{ g[1]|length }}{% endfor %}"],
    "indent": ["{{ text|indent(2) }}|{{ text|indent(4, true) }}|{{ 'x\n\ny'|indent(2, blank=true) }}",
               "{{ 'a\r\nb\rc'|indent(2) }}|{{ ''|indent(2, true) }}|{{ 'x\ny'|indent('>>', true) }}|{{ '\nz'|indent }}"],
    "int": ["{{ '42'|int }} {{ '0x1A'|int(base=16) }} {{ ' 7 '|int }} {{ '4.9'|int }} {{ 'zz'|int(-1) }} {{ '1_000'|int }}"
            " {{ 3.99|int }} {{ true|int }} {{ '-12'|int }} {{ 'ff'|int(0, 16) }} {{ none|int }}"],
    "items": ["{% for k, v in d|items %}{{ k }}={{ v }} {% endfor %}{{ d|items|list }} {{ y|items|list }}"],
    "join": ["{{ [1, 2, 3]|join }} {{ ['a', 'b']|join(', ') }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('-') }}"],
    "last": ["{{ [3, 1]|last }} {{ 'abc'|last }} {{ {'a': 1, 'b': 2}|last }}"],
    "length": ["{{ [1, 2]|length }} {{ 'héllo'|length }} {{ {'a': 1}|length }} {{ y|length }}", "{{ 3|length }}"],
    "list": ["{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ [1]|list }}"],
    "lower": ["{{ 'ÀÉÎ Straße ΣΑΣ'|lower }} {{ 'MiXeD 123'|lower }}"],
    "map": ["{{ users|map(attribute='name')|join('/') }} {{ ['a', 'B']|map('upper')|list }}"
            " {{ ['x  ', ' y']|map('trim')|list }} {{ [1.55, 2.25]|map('round', 1)|list }}",
            "{{ users|map(attribute='zip', default='-')|list }} {{ [[1, 2], [3]]|map('length')|list }}"],
    "max": ["{{ ['b', 'A', 'c']|max }} {{ ['b', 'A', 'c']|max(case_sensitive=true) }} {{ users|max(attribute='age') }}"
            " [{{ []|max }}] {{ [1, 3.5, 2]|max }}"],
    "min": ["{{ ['b', 'A', 'c']|min }} {{ ['b', 'A', 'c']|min(case_sensitive=true) }} {{ users|min(attribute='age') }}"],
    "reject": ["{{ [1, 2, 3, 4]|reject('even')|list }} {{ [1, 'a', none]|reject('none')|list }} {{ [0, 1, '']|reject|list }}"],
    "rejectattr": ["{{ users|rejectattr('age', 'gt', 15)|map(attribute='name')|list }} {{ users|rejectattr('age')|list }}"],
    "replace": ["{{ 'aXbX'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '.') }}"],
    "reverse": ["{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ {'a': 1, 'b': 2}|reverse|list }}"],
    "round": ["{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1.234|round(1, 'ceil') }} {{ 1.234|round(1, 'floor') }}"
              " {{ 7|round }} {{ -2.5|round }} {{ 1234.5|round(-2) }} {{ 0.125|round(2) }}",
              "{{ 1.5|round(0, 'banker') }}"],
    "safe": ["{{ '<b>'|safe }} {{ 3|safe }}"],
    "select": ["{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4, 5]|select('greaterthan', 2)|list }}"
               " {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|select('==', 2)|list }} {{ [1, 2, 3]|select('<', 3)|list }}"],
    "selectattr": ["{{ users|selectattr('age', 'gt', 15)|map(attribute='name')|list }}"
                   " {{ users|selectattr('city', 'in', ['a', 'b'])|map(attribute='name')|list }}"],
    "slice": ["{{ [1, 2, 3, 4, 5, 6, 7]|slice(3)|list }} {{ [1, 2, 3, 4]|slice(3, 'x')|list }} {{ [1]|slice(2)|list }}"],
    "sort": ["{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(true) }}",
             "{{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|sort(attribute='age,name')|map(attribute='name')|list }}"
             " {{ users|sort(attribute='city', reverse=true)|map(attribute='name')|list }}",
             "{{ [1, 'a']|sort }}"],
    "string": ["{{ 42|string }} {{ none|string }} {{ [1, 'a']|string }} {{ (1,)|string }}"],
    "striptags": ["{{ '<p>Hello <b>world</b>!</p>  <!-- c <i>x</i> -->  &amp; &lt;tag&gt; &#65;&#x42; end'|striptags }}"],
    "sum": ["{{ [1, 2, 3]|sum }} {{ users|sum(attribute='age') }} {{ [1, 2]|sum(start=10) }} {{ [0.5, 1]|sum }}"],
    "title": ["{{ \"hello world-wide (web) they're [x] <y\"|title }} {{ 'ÉCOLE élève'|title }}"],
    "tojson": ["{{ d|tojson }} {{ d|tojson(indent=2) }} {{ [1.0, 2e-7, none, false, 'ü'] | tojson }}",
               # transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
               "{{ u|tojson }} {{ u|tojson(true) }} {{ u|tojson(separators=(',', ':')) }} {{ [1, [2]]|tojson(false, 1) }}",
               "{{ u|tojson(indent=2, separators=(';', '=')) }} {{ d|tojson(sort_keys=true, ensure_ascii=true) }}"],
    "trim": ["[{{ '  x  '|trim }}] {{ 'xxhixx'|trim('x') }} [{{ '\u3000y\n'|trim }}]"],
    "truncate": ["{{ 'foo bar baz qux'|truncate(9) }} {{ 'foo bar baz qux'|truncate(9, true) }}"
                 " {{ 'foo bar baz qux'|truncate(11, false, '…', 0) }} {{ 'short'|truncate(3, leeway=5) }}",
                 "{{ 'abcdefghij'|truncate(2) }}"],
    "unique": ["{{ [3, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ ['a', 'A', 'b']|unique(true)|list }}"
               " {{ users|unique(attribute='city')|map(attribute='name')|list }}"],
    "upper": ["{{ 'straße ǆ ﬁx'|upper }} {{ 'abc'|upper }}"],
    "urlencode": ["{{ 'a b/c?d=é'|urlencode }} {{ {'q': 'x y', 'n': 1}|urlencode }} {{ [('a', 'b&c')]|urlencode }}"],
    "wordcount": ["{{ 'hello, big-world foo_bar 42 héllo'|wordcount }} {{ ''|wordcount }}"],
    "xmlattr": ["<a{{ {'href': 'x&y', 'title': none, 'class': 'c'}|xmlattr }}> <a{{ {'k': 1}|xmlattr(false) }}>",
                "{{ {'a b': 1}|xmlattr }}"],
}
REFUSED_FILTERS = {"pprint", "random", "urlize", "wordwrap"}

TESTS = {
    "boolean": "{{ true is boolean }} {{ 1 is boolean }}",
    "callable": "{{ range is callable }} {{ 1 is callable }} {{ 'a'.upper is callable }}",
    "defined": "{{ x is defined }} {{ y is defined }}",
    "divisibleby": "{{ 10 is divisibleby 5 }} {{ 10 is divisibleby 3 }}",
    "eq": "{{ 1 is eq 1 }} {{ 'a' is eq 'b' }}",
    "equalto": "{{ 1 is equalto 1.0 }} {{ [1] is equalto [2] }}",
    "escaped": "{{ 'x' is escaped }} {{ 1 is escaped }}",
    "even": "{{ 4 is even }} {{ 3 is even }}",
    "false": "{{ false is false }} {{ 0 is false }}",
    "filter": "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'wordwrap' is filter }}",
    "float": "{{ 1.5 is float }} {{ 1 is float }}",
    "ge": "{{ 3 is ge 3 }} {{ 2 is ge 3 }}",
    "greaterthan": "{{ 3 is greaterthan 2 }} {{ 2 is greaterthan 2 }}",
    "gt": "{{ 3 is gt 3 }} {{ 'b' is gt 'a' }}",
    "in": "{{ 1 is in [1] }} {{ 'x' is in 'abc' }} {{ 'k' is in {'k': 1} }}",
    "integer": "{{ 1 is integer }} {{ true is integer }} {{ 1.0 is integer }}",
    "iterable": "{{ 'a' is iterable }} {{ [] is iterable }} {{ 1 is iterable }} {{ {} is iterable }}",
    "le": "{{ 2 is le 1 }} {{ 1 is le 1 }}",
    "lessthan": "{{ 1 is lessthan 2 }} {{ 2 is lessthan 2 }}",
    "lower": "{{ 'abc' is lower }} {{ '123' is lower }} {{ 'aB' is lower }} {{ 'ß1' is lower }}",
    "lt": "{{ 1 is lt 2 }} {{ 2 is lt 1 }}",
    "mapping": "{{ {} is mapping }} {{ [] is mapping }}",
    "ne": "{{ 1 is ne 2 }} {{ 1 is ne 1 }}",
    "none": "{{ none is none }} {{ 0 is none }}",
    "number": "{{ true is number }} {{ 1.5 is number }} {{ '1' is number }}",
    "odd": "{{ 3 is odd }} {{ 2 is odd }}",
    "sameas": "{{ x is sameas x }} {{ none is sameas none }}",
    "sequence": "{{ [] is sequence }} {{ 'a' is sequence }} {{ 1 is sequence }}",
    "string": "{{ 1 is string }} {{ 'a' is string }}",
    "test": "{{ 'odd' is test }} {{ 'nope' is test }} {{ 'upper' is test }}",
    "true": "{{ true is true }} {{ 1 is true }}",
    "undefined": "{{ y is undefined }} {{ x is undefined }}",
    "upper": "{{ 'ABC' is upper }} {{ 'ABc' is upper }} {{ '1' is upper }}",
    "==": "{{ [1, 2, 3]|select('==', 2)|list }}",
    "!=": "{{ [1, 2, 3]|select('!=', 2)|list }}",
    "<": "{{ [1, 2, 3]|select('<', 2)|list }}",
    "<=": "{{ [1, 2, 3]|select('<=', 2)|list }}",
    ">": "{{ [1, 2, 3]|select('>', 2)|list }}",
    ">=": "{{ [1, 2, 3]|select('>=', 2)|list }}",
}

STR_METHODS = {
    "capitalize": "{{ 'hello World'.capitalize() }} {{ 'éA'.capitalize() }}",
    "casefold": "{{ 'Straße ÀB'.casefold() }}",
    "center": "[{{ 'ab'.center(7, '*') }}][{{ 'abc'.center(6) }}][{{ 'abc'.center(2) }}][{{ 'ab'.center(5) }}]",
    "count": "{{ 'banana'.count('a') }} {{ 'banana'.count('an', 2) }} {{ 'aaa'.count('') }} {{ 'aaaa'.count('aa') }}",
    "endswith": "{{ 'hello'.endswith('lo') }} {{ 'hello'.endswith(('x', 'llo')) }} {{ 'hello'.endswith('l', 0, 3) }}",
    "expandtabs": "[{{ 'a\tbc\td'.expandtabs() }}][{{ 'a\tb\n\tc'.expandtabs(4) }}]",
    "find": "{{ 'héllo'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.find('l', 3) }} {{ 'hello'.find('', 2) }}",
    "format": "{{ '{} {}'.format(1, 'a') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{x:>5}|{y:.2f}|{z:05d}|{w:,}'.format(x='r', y=3.14159, z=42, w=1234567) }}"
              " {{ '{0[k]} {1[0]}'.format({'k': 'v'}, [9]) }} {{ '{:^9}|{:*<6}|{!r}|{{}}'.format('mid', 'l', 's') }}"
              " {{ '{:x} {:#b} {:e} {:%} {:+} {:.3} {}'.format(255, 5, 1234.5, 0.25, 3, 2.0, 1.5) }} {{ '{:=+8.2f}'.format(-3.1) }}",
    "format_map": "{{ '{a}-{b}'.format_map({'a': 1, 'b': 'x'}) }}",
    "index": "{{ 'hello'.index('l') }} {{ 'hello'.index('lo', 1) }}",
    "isalnum": "{{ 'abc1'.isalnum() }} {{ 'ab c'.isalnum() }} {{ ''.isalnum() }} {{ 'é١'.isalnum() }}",
    "isalpha": "{{ 'abc'.isalpha() }} {{ 'ab1'.isalpha() }} {{ 'héllo日本'.isalpha() }}",
    "isascii": "{{ 'abc'.isascii() }} {{ 'é'.isascii() }} {{ ''.isascii() }}",
    "isdecimal": "{{ '123'.isdecimal() }} {{ '²'.isdecimal() }} {{ '١٢'.isdecimal() }}",
    "isdigit": "{{ '123'.isdigit() }} {{ '²'.isdigit() }} {{ '½'.isdigit() }} {{ '1a'.isdigit() }}",
    "isidentifier": "{{ 'a_1'.isidentifier() }} {{ '1a'.isidentifier() }} {{ 'é'.isidentifier() }} {{ ''.isidentifier() }}",
    "islower": "{{ 'abc'.islower() }} {{ 'aBc'.islower() }} {{ '1'.islower() }}",
    "isnumeric": "{{ '½'.isnumeric() }} {{ '三'.isnumeric() }} {{ 'x'.isnumeric() }}",
    "isprintable": "{{ 'ab c'.isprintable() }} {{ 'a\tb'.isprintable() }} {{ ''.isprintable() }}",
    "isspace": "{{ ' \t\n'.isspace() }} {{ ''.isspace() }} {{ '\u3000'.isspace() }} {{ 'a '.isspace() }}",
    "istitle": "{{ 'Hello World'.istitle() }} {{ 'Hello world'.istitle() }} {{ 'HW'.istitle() }} {{ '1A'.istitle() }}",
    "isupper": "{{ 'ABC'.isupper() }} {{ 'AbC'.isupper() }} {{ 'A1'.isupper() }}",
    "join": "{{ '-'.join(['a', 'b']) }} {{ ', '.join('xyz') }} {{ ''.join([]) }}",
    "ljust": "[{{ 'ab'.ljust(5, '.') }}][{{ 'abcdef'.ljust(2) }}]",
    "lower": "{{ 'ÀB'.lower() }}",
    "lstrip": "[{{ '  x '.lstrip() }}][{{ 'xxy'.lstrip('x') }}]",
    "partition": "{{ 'a=b=c'.partition('=') }} {{ 'abc'.partition('x') }}",
    "removeprefix": "{{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x'.removeprefix('y') }}",
    "removesuffix": "{{ 'x.txt'.removesuffix('.txt') }} {{ 'x'.removesuffix('y') }}",
    "replace": "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} {{ 'hello'.replace('l', 'L') }}",
    "rfind": "{{ 'hello'.rfind('l') }} {{ 'hello'.rfind('z') }} {{ 'hello'.rfind('l', 0, 3) }}",
    "rindex": "{{ 'hello'.rindex('l') }}",
    "rjust": "[{{ 'ab'.rjust(5) }}][{{ '7'.rjust(3, '0') }}]",
    "rpartition": "{{ 'a=b=c'.rpartition('=') }} {{ 'abc'.rpartition('x') }}",
    "rsplit": "{{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b  c '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',') }} {{ 'a b c'.rsplit() }}",
    "rstrip": "[{{ 'x  '.rstrip() }}][{{ 'xyy'.rstrip('y') }}]",
    "split": "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ '  a b c  '.split(None, 1) }}"
             " {{ 'a</think>b'.split('</think>')[-1] }} {{ ''.split() }} {{ ''.split(',') }}",
    "splitlines": "{{ 'a\nb\r\nc\rd\x0be\x1cf\u2028g'.splitlines() }} {{ 'a\nb\n'.splitlines(true) }} {{ ''.splitlines() }}",
    "startswith": "{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.startswith('l', 2) }}",
    "strip": "[{{ '  x  '.strip() }}][{{ '--x--'.strip('-') }}][{{ 'xyx'.strip('xy') }}]",
    "swapcase": "{{ 'Hello ÀbC 1'.swapcase() }}",
    "title": "{{ \"they're bill's friends from the UK 3rd\".title() }} {{ 'hello wORLD'.title() }}",
    "upper": "{{ 'straße ǆ'.upper() }}",
    "zfill": "{{ '42'.zfill(5) }} {{ '-42'.zfill(5) }} {{ 'abc'.zfill(2) }} {{ '+7'.zfill(4) }}",
}
REFUSED_STR_METHODS = {"encode", "maketrans", "translate"}

# The immutable sandbox refuses the methods that modify (both renderers must fail on those).
LIST_METHODS = {
    "count": "{{ [1, 2, 1].count(1) }}", "index": "{{ [1, 2].index(2) }}", "copy": "{{ [1, 2].copy() }}",
    "append": "{{ xs.append(1) }}", "extend": "{{ xs.extend([1]) }}", "insert": "{{ xs.insert(0, 1) }}",
    "pop": "{{ xs.pop() }}", "remove": "{{ xs.remove(1) }}", "clear": "{{ xs.clear() }}",
    "sort": "{{ xs.sort() }}", "reverse": "{{ xs.reverse() }}",
}
DICT_METHODS = {
    "copy": "{{ d.copy() }}", "fromkeys": "{{ d.fromkeys(['a', 'b'], 0) }} {{ d.fromkeys('xy') }}",
    "get": "{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 'fallback') }}",
    "items": "{{ d.items()|list }}", "keys": "{{ d.keys()|list }}", "values": "{{ d.values()|list }}",
    "clear": "{{ d.clear() }}", "pop": "{{ d.pop('a') }}", "popitem": "{{ d.popitem() }}",
    "setdefault": "{{ d.setdefault('z', 1) }}", "update": "{{ d.update({'z': 1}) }}",
}
GLOBALS = {
    "range": "{{ range(3)|list }} {{ range(1, 7, 2)|list }}",
    "dict": "{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "joiner": "{% set j = joiner('|') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}"
              "{% set k = joiner() %}{% for x in 'ab' %}{{ k() }}{{ x }}{% endfor %}",
}
REFUSED_GLOBALS = {"cycler", "lipsum"}

OPERATORS = [  # the issue's cases and the printf operator
    "{{ 'a,b,c'.rsplit(',', 1) }} {{ {'b': 1, 'a': 2}|dictsort }} {{ '%05.1f'|format(3.14159) }} {{ '%s'|format('x') }}",
    "{{ '%d items' % 3 }} {{ '%s/%s' % ('a', 'b') }} {{ '%(k)s' % {'k': 'v'} }} {{ '%5.1f%%' % 12.345 }}",
    "{{ (1, 2) == [1, 2] }} {{ (1, 2) + (3,) }} {{ [1, 2][::-1] }} {{ (1, 2, 3)[1:] }} {{ true + 1 }} {{ -true }}",
]

VARIABLES = dict(USERS, x=1, xs=[1, 2], d={"b": 1, "a": 3, "c": 2}, u={"k": "é😀\x7fz\n", "n": [1, {"m": None}]}, e={"B": 1, "a": 2}, s="<a href=\"x\">'&'</a>",
                 text="line1\nline2\n\nline4")


def cases():
    out = []
    for table, kind in ((FILTERS, "filter"),):
        for name, sources in table.items():
            out += [(f"{kind}:{name}:{i}", src) for i, src in enumerate(sources)]
    for table, kind in ((TESTS, "test"), (STR_METHODS, "str"), (LIST_METHODS, "list"), (DICT_METHODS, "dict"),
                        (GLOBALS, "global")):
        out += [(f"{kind}:{name}", src) for name, src in table.items()]
    out += [(f"operator:{i}", src) for i, src in enumerate(OPERATORS)]
    return out


CASES = cases()


@pytest.mark.parametrize("source", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_builtin_matches_jinja2(build_dir, tmp_path, source):
    assert_renders_like_jinja2(build_dir, tmp_path, source, VARIABLES)


REFUSED = [("filter", n, "{{ [1, 2]|" + n + " }}") for n in sorted(REFUSED_FILTERS)] + \
          [("str", n, "{{ 'abc'." + n + "() }}") for n in sorted(REFUSED_STR_METHODS)] + \
          [("global", n, "{{ " + n + "() }}") for n in sorted(REFUSED_GLOBALS)]


@pytest.mark.parametrize("kind,name,source", REFUSED, ids=[f"{k}:{n}" for k, n, _ in REFUSED])
def test_refused_builtins_fail_naming_themselves(build_dir, tmp_path, kind, name, source):
    got = nibble_render(build_dir, tmp_path, source, VARIABLES)
    assert "error" in got and name in got["error"], got


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_inventory_covers_every_jinja2_builtin():
    """jinja2's filter and test tables, and Python's str/list/dict methods, are each covered by a
    differential case or refused by name; a new jinja2 or Python release that adds one fails here."""
    assert set(jinja2.filters.FILTERS) == set(FILTERS) | REFUSED_FILTERS
    assert set(jinja2.tests.TESTS) == set(TESTS)
    assert public(dir(str)) == set(STR_METHODS) | REFUSED_STR_METHODS
    assert public(dir(list)) == set(LIST_METHODS)
    assert public(dir(dict)) == set(DICT_METHODS)
    assert set(jinja2.defaults.DEFAULT_NAMESPACE) == set(GLOBALS) | REFUSED_GLOBALS
