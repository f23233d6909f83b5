#!/usr/bin/env python3
"""Checks that include/mapping.h leads with the core (issue 26 item 4).

1. The opening comment has a numbered "Step by step" (1, 2, 3, ... with no
   gap), and every mapping_* function or type it names is declared in the header.
2. The core a first user needs (open/close, allocate/free on both sides,
   sync both ways, streams and events, errors) is declared before the first
   declaration of any extension.
3. The extensions come in the order the opening comment states: device-side
   operations, statistics, tracing, mirrors, several devices (multimirrors
   after every mirror function), batches and pipelines, interop. Each
   group's declarations all come before the next group's first one.

Usage: check_header_order.py [HEADER] (default: this repository's
include/mapping.h). Exit status 0 when the order holds, 1 with one line per
problem. Run by CTest as lint.header_order.
"""
import os
import re
import sys

HEADER = (sys.argv[1] if len(sys.argv) > 1 else
          os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'include', 'mapping.h'))

CORE = [
    'mapping_open', 'mapping_close', 'mapping_list_backends', 'mapping_list_devices',
    'mapping_device_get_info', 'mapping_backend_name',
    'mapping_allocate_gpu', 'mapping_free_gpu', 'mapping_allocate_cpu', 'mapping_free_cpu',
    'mapping_buffer_size',
    'mapping_sync_to_gpu', 'mapping_sync_to_cpu', 'mapping_sync_to_gpu_range', 'mapping_sync_to_cpu_range',
    'mapping_stream_create', 'mapping_stream_destroy', 'mapping_stream_synchronize',
    'mapping_event_record', 'mapping_stream_wait_event', 'mapping_event_synchronize',
    'mapping_event_query', 'mapping_event_destroy',
    'mapping_status_string', 'mapping_last_error', 'mapping_last_error_message',
]

# Extension groups in the order the opening comment states; a function
# belongs to the first group whose pattern matches its name.
GROUPS = [
    ('device-side operations', r'mapping_(copy_gpu|fill_gpu)$'),
    ('statistics', r'mapping_device_stats'),
    ('tracing', r'mapping_trace_'),
    ('mirrors', r'mapping_mirror_'),
    ('several devices', r'mapping_(copy_peer|multimirror_)'),
    ('batches and pipelines', r'mapping_(batch|pipeline)_'),
    ('interop', r'mapping_(open_opencl|import_)'),
]

problems = []
with open(HEADER, encoding='utf-8') as f:
    text = f.read()

# Declarations in header order: MAPPING_API <type> mapping_name( ... ;
decls = []
for m in re.finditer(r'^MAPPING_API\b[^;(]*?\b(mapping_[a-z0-9_]+)\s*\(', text, re.M):
    decls.append((m.start(), m.group(1)))
first = {}
for pos, name in decls:
    first.setdefault(name, pos)
if not decls:
    problems.append('no MAPPING_API declarations found in %s' % HEADER)


def line_of(pos):
    return text.count('\n', 0, pos) + 1


# 1. The step by step.
opening = text[:text.find('*/')] if '*/' in text else ''
if 'Step by step' not in opening:
    problems.append('the opening comment has no "Step by step"')
else:
    steps = opening[opening.find('Step by step'):]
    numbers = [int(n) for n in re.findall(r'^ \* (\d+)\. ', steps, re.M)]
    if len(numbers) < 5 or numbers != list(range(1, len(numbers) + 1)):
        problems.append('the step by step is not numbered 1..N with at least 5 steps: %s' % numbers)
    body = text[len(opening):]
    for name in sorted(set(re.findall(r'\b(mapping_[a-z0-9_]+)\b', steps))):
        if name not in first and not re.search(r'\b(typedef|struct)\b[^;{]*\b%s\b' % name, body):
            problems.append('the opening comment names %s, which the header does not declare' % name)

# 2. The core before every extension.
ext = [(pos, name) for pos, name in decls if any(re.match(p, name) for _, p in GROUPS)]
first_ext = min(ext) if ext else None
for name in CORE:
    if name not in first:
        problems.append('core function %s is not declared' % name)
    elif first_ext and first[name] > first_ext[0]:
        problems.append('core function %s (line %d) comes after the extension %s (line %d)'
                        % (name, line_of(first[name]), first_ext[1], line_of(first_ext[0])))

# 3. The extension groups in the stated order.
spans = []
for label, pattern in GROUPS:
    where = [pos for pos, name in decls
             if next((l for l, p in GROUPS if re.match(p, name)), None) == label]
    if not where:
        problems.append('no declaration of the group "%s"' % label)
        continue
    spans.append((label, min(where), max(where)))
for (a, _, a_last), (b, b_first, _) in zip(spans, spans[1:]):
    if a_last > b_first:
        problems.append('%s (last at line %d) must all come before %s (first at line %d)'
                        % (a, line_of(a_last), b, line_of(b_first)))

for p in problems:
    print(p)
sys.exit(1 if problems else 0)
