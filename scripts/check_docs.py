#!/usr/bin/env python3
"""Checks the README and man page tables that can be checked against the code.

1. Environment variables: the settings table (src/os/settings.c, the rules
   every open checks), the table of docs/environment.md ("| variable |
   accepted |") and the code name the same variables: every MAPPING_*
   variable the code reads (src/, tools/, bench/) is a row of the settings
   table, every row there is read somewhere and has a row in the docs, and
   every row of the docs is in the settings table. Each word a row accepts
   (its `words`) is in the docs row's "accepted" cell, in backquotes. A read
   is getenv("MAPPING_X"), or a call of a function that passes its parameter
   to getenv (found in the code, e.g. env_or_null("MAPPING_X")).
2. Layout: every path in README's layout table ("| folder | what it holds |")
   exists, and every top-level folder and every folder of src/ is in it.
3. The man page's --csv columns are the header bench/bench.c writes.
4. File tables ("| file | job |" in docs/*.md): every file named exists (a
   bare name is looked up under src/), and every file of a src/ folder the
   table describes is in it.
5. README's lists against the tree: its table of bench sections ("| section
   | measures |") names every section bench/*.c registers (BENCH_SECTION)
   and no other; the layout table's examples/ row names every examples/*.c,
   and its docs/ row links every docs/*.md and names the man page, and each
   file they name exists.

Usage: check_docs.py [SOURCE_DIR] (default: this script's repository).
Exit status 0 when everything matches, 1 with one line per mismatch.
Run by CTest as lint.docs.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..'))
CODE_DIRS = ('src', 'tools', 'bench')
problems = []


def read(rel):
    with open(os.path.join(ROOT, rel), encoding='utf-8') as f:
        return f.read()


def code_files():
    for top in CODE_DIRS:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                if name.endswith(('.c', '.h')):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def strip_comments(text):
    """C comments become spaces (line numbers kept); string literals stay."""
    def blank(m):
        s = m.group(0)
        return s if s.startswith('"') else re.sub(r'[^\n]', ' ', s)
    return re.sub(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*', blank, text, flags=re.S)


def all_tables(text, header):
    """The rows of every markdown table whose header line starts with
    `header`, one list of rows (each a list of cells) per table."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        if line.replace(' ', '').startswith(header.replace(' ', '')):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith('|'):
                    break
                rows.append([c.strip() for c in row.strip().strip('|').split('|')])
            tables.append(rows)
    return tables


def table_rows(text, header):
    """The rows of README's first table with this header."""
    tables = all_tables(text, header)
    if not tables:
        problems.append(f'README.md: no table with the header "{header}"')
        return []
    return tables[0]


# ---- 1. environment variables ----

def variables_read():
    """{variable: first 'file:line' reading it}."""
    sources = {rel: strip_comments(read(rel)) for rel in code_files()}
    # Functions that hand one of their parameters to getenv.
    readers = {'getenv', 'secure_getenv'}
    definition = re.compile(r'^[A-Za-z_][^;{}()]*?\b(\w+)\s*\(([^)]*)\)\s*\{?\s*$')
    for text in sources.values():
        current, params = None, set()
        for line in text.splitlines():
            m = definition.match(line)
            if m:
                current = m.group(1)
                params = set(re.findall(r'(\w+)\s*(?:,|$)', m.group(2)))
            for arg in re.findall(r'\bgetenv\s*\(\s*(\w+)\s*\)', line):
                if current and arg in params:
                    readers.add(current)
    call = re.compile(r'\b(' + '|'.join(sorted(readers)) + r')\s*\(\s*"(MAPPING_[A-Z0-9_]+)"')
    found = {}
    for rel, text in sources.items():
        for n, line in enumerate(text.splitlines(), 1):
            for _, var in call.findall(line):
                found.setdefault(var, f'{rel}:{n}')
    return found


SETTINGS = 'src/os/settings.c'
ENV_DOC = 'docs/environment.md'


def settings_table():
    """{variable: (kind, [accepted words])} from the rows of SETTINGS:
    {"MAPPING_X", S(KIND), "w1,w2" or NULL, ...}."""
    rows = {}
    row = re.compile(r'^\s*\{\s*"(MAPPING_[A-Z0-9_]+)",\s*S\((\w+)\),\s*(NULL|"[^"]*")', re.M)
    for var, kind, words in row.findall(strip_comments(read(SETTINGS))):
        rows[var] = (kind, words.strip('"').split(',') if words != 'NULL' else [])
    if not rows:
        problems.append(f'{SETTINGS}: no rows found ({{"MAPPING_X", S(KIND), ...}})')
    return rows


def documented_variables():
    """{variable: its 'accepted' cell} of ENV_DOC's table."""
    tables = all_tables(read(ENV_DOC), '| variable | accepted |')
    if not tables:
        problems.append(f'{ENV_DOC}: no table with the header "| variable | accepted |"')
        return {}
    documented = {}
    for cells in tables[0]:
        for var in re.findall(r'`(MAPPING_[A-Z0-9_]+)`', cells[0]):
            if var in documented:
                problems.append(f'{ENV_DOC}: {var} has two rows')
            documented[var] = cells[1] if len(cells) > 1 else ''
    return documented


def check_environment():
    table = settings_table()
    documented = documented_variables()
    read_vars = variables_read()
    for var, where in sorted(read_vars.items()):
        if var not in table:
            problems.append(f'{SETTINGS}: {var} is read ({where}) but is not a row of the settings table')
    for var, (kind, words) in sorted(table.items()):
        if var not in read_vars:
            problems.append(f'{SETTINGS}: {var} is a row of the settings table, but nothing in '
                            f'{", ".join(d + "/" for d in CODE_DIRS)} reads it')
        if var not in documented:
            problems.append(f'{ENV_DOC}: {var} is a row of the settings table ({SETTINGS}) but has no row in the '
                            'table "| variable | accepted |"')
            continue
        for word in words:
            if f'`{word}`' not in documented[var]:
                problems.append(f'{ENV_DOC}: the row of {var} does not list `{word}` as accepted ({SETTINGS} does)')
    for var in sorted(documented):
        if var not in table:
            problems.append(f'{ENV_DOC}: {var} has a row, but the settings table ({SETTINGS}) has none')
    return len(table)


# ---- 2. layout ----

def tracked_folders():
    """Top-level folders and folders of src/ holding files git knows (or,
    outside a git checkout, that exist and are not build output)."""
    try:
        out = subprocess.run(['git', '-C', ROOT, 'ls-files'], capture_output=True, text=True, check=True).stdout
        paths = [p for p in out.splitlines() if p and os.path.exists(os.path.join(ROOT, p))]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(('.', 'build'))]
            paths += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
    tops, srcs = set(), set()
    for p in paths:
        parts = p.split('/')
        if len(parts) > 1 and not parts[0].startswith('.'):
            tops.add(parts[0] + '/')
        if len(parts) > 2 and parts[0] == 'src':
            srcs.add('src/' + parts[1] + '/')
    return tops, srcs


def check_layout(readme):
    named = []
    for cells in table_rows(readme, '| folder | what it holds |'):
        named += re.findall(r'`([^`]+)`', cells[0])
    for path in named:
        if not os.path.exists(os.path.join(ROOT, path)):
            problems.append(f'README.md: the layout table names `{path}`, which does not exist')
    tops, srcs = tracked_folders()
    for folder in sorted(tops | srcs):
        if not any(p == folder or p.startswith(folder) for p in named):
            problems.append(f'README.md: the layout table does not mention `{folder}`')
    return len(named)


# ---- 3. the man page's CSV columns ----

def check_csv():
    code = read('bench/bench.c')
    m = re.search(r'printf\("(table,[^"\\]*)\\n"\)', code)
    if not m:
        problems.append('bench/bench.c: no CSV header line (printf("table,...\\n")) found')
        return
    header = m.group(1)
    man = read('docs/mapping.1')
    m = re.search(r'^\.B \\-\\-csv\n(.*?)(?=^\.(?:TP|SH))', man, flags=re.M | re.S)
    if not m:
        problems.append('docs/mapping.1: no ".B \\-\\-csv" entry')
        return
    text = m.group(1).replace('\\-', '-').replace('\n', ' ')
    cols = re.search(r'\b(table(?:,[a-z_]+)+)', text)
    if not cols or cols.group(1) != header:
        problems.append(f'docs/mapping.1: --csv lists the columns {cols.group(1) if cols else "(none)"!r}; '
                        f'bench/bench.c writes {header!r}')


# ---- 4. file tables in docs/ ----

def check_file_tables():
    by_name = {}
    for folder, dirs, names in os.walk(os.path.join(ROOT, 'src')):
        for name in names:
            by_name.setdefault(name, []).append(os.path.relpath(os.path.join(folder, name), ROOT))
    checked = 0
    docs = os.path.join(ROOT, 'docs')
    for doc in sorted(os.listdir(docs)):
        if not doc.endswith('.md'):
            continue
        rel_doc = 'docs/' + doc
        for rows in all_tables(read(rel_doc), '| file | job |'):
            listed, homes = set(), set()
            for cells in rows:
                for name in re.findall(r'`([^`]+)`', cells[0]):
                    path = name.rstrip('/')
                    if '/' not in path:
                        found = by_name.get(path, [])
                        if len(found) != 1:
                            problems.append(f'{rel_doc}: the file table names `{name}`, which is '
                                            f'{"not a file under src/" if not found else "ambiguous: " + ", ".join(found)}')
                            continue
                        path = found[0]
                    elif not os.path.exists(os.path.join(ROOT, path)):
                        problems.append(f'{rel_doc}: the file table names `{name}`, which does not exist')
                        continue
                    listed.add(path)
                    checked += 1
                    if path.startswith('src/') and os.path.isfile(os.path.join(ROOT, path)):
                        homes.add(os.path.dirname(path))
            for home in sorted(homes):
                for name in sorted(os.listdir(os.path.join(ROOT, home))):
                    path = home + '/' + name
                    if os.path.isfile(os.path.join(ROOT, path)) and path not in listed:
                        problems.append(f'{rel_doc}: the file table describes {home}/ but not `{name}`')
    return checked


# ---- 5. README's lists ----

def bench_sections():
    names = set()
    for name in sorted(os.listdir(os.path.join(ROOT, 'bench'))):
        if name.endswith('.c'):
            names.update(re.findall(r'^BENCH_SECTION\(\w+,\s*\d+,\s*"([^"]+)"', read('bench/' + name), flags=re.M))
    return names


def layout_row(readme, folder):
    for cells in table_rows(readme, '| folder | what it holds |'):
        if f'`{folder}`' in cells[0]:
            return ' | '.join(cells[1:])
    problems.append(f'README.md: the layout table has no row for `{folder}`')
    return ''


def check_readme_lists(readme):
    listed = {c[0].strip('`') for c in table_rows(readme, '| section | measures |')}
    sections = bench_sections()
    for s in sorted(sections - listed):
        problems.append(f'README.md: bench section `{s}` (bench/) is not in the table "| section | measures |"')
    for s in sorted(listed - sections):
        problems.append(f'README.md: the table of bench sections lists `{s}`, which no bench/*.c registers')
    row = layout_row(readme, 'examples/')
    named = set(re.findall(r'`([\w.-]+\.c)`', row))
    present = {n for n in os.listdir(os.path.join(ROOT, 'examples')) if n.endswith('.c')}
    for n in sorted(present - named):
        problems.append(f'README.md: the layout row of examples/ does not name `{n}`')
    for n in sorted(named - present):
        problems.append(f'README.md: the layout row of examples/ names `{n}`, which is not in examples/')
    row = layout_row(readme, 'docs/')
    linked = set(re.findall(r'\(docs/([\w.-]+\.md)\)', row))
    present = {n for n in os.listdir(os.path.join(ROOT, 'docs')) if n.endswith('.md')}
    for n in sorted(present - linked):
        problems.append(f'README.md: the layout row of docs/ does not link docs/{n}')
    for n in sorted(linked - present):
        problems.append(f'README.md: the layout row of docs/ links docs/{n}, which does not exist')
    if 'mapping.1' not in row:
        problems.append('README.md: the layout row of docs/ does not name the man page `mapping.1`')
    return len(sections) + len(named) + len(linked)


def check_guides_are_not_lab_notes():
    """The guides are how-tos: project history (issue numbers, sessions) lives
    in BENCHMARKS-archive.md and the issue tracker, not in README.md or docs/."""
    n = 0
    docs = ['README.md'] + sorted('docs/' + f for f in os.listdir(os.path.join(ROOT, 'docs')) if f.endswith('.md'))
    pattern = re.compile(r'\b(issue [0-9]+|(first|second|third|fourth|fifth|sixth|last|this|previous) session)\b', re.I)
    for rel in docs:
        n += 1
        for i, line in enumerate(read(rel).splitlines(), 1):
            m = pattern.search(line)
            if m and 'BENCHMARKS-archive' not in line:
                problems.append(f'{rel}:{i}: "{m.group(0)}": project history belongs in BENCHMARKS-archive.md, '
                                'not in a guide')
    return n


def main():
    readme = read('README.md')
    n_vars = check_environment()
    n_paths = check_layout(readme)
    check_csv()
    n_files = check_file_tables()
    n_guides = check_guides_are_not_lab_notes()
    n_lists = check_readme_lists(readme)
    for p in problems:
        print(p)
    if problems:
        print(f'check_docs: {len(problems)} mismatch(es) between the docs and the code')
        return 1
    print(f'check_docs: {n_vars} environment variables, {n_paths} layout paths, {n_files} files of docs/ file '
          f'tables, {n_lists} bench sections, examples and docs pages of README\'s lists and the CSV columns '
          f'match the code; {n_guides} guides carry no project history')
    return 0


if __name__ == '__main__':
    sys.exit(main())
