"""The type stubs (mapping/__init__.pyi) name what the package has."""
import ast
import os

import mapping


def test_every_stubbed_name_exists():
    stub = os.path.join(os.path.dirname(mapping.__file__), "__init__.pyi")
    tree = ast.parse(open(stub).read())
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
    assert len(names) > 30
    missing = [n for n in names if not hasattr(mapping, n)]
    assert missing == []
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and hasattr(mapping, cls.name):
            for member in cls.body:
                if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                    assert hasattr(getattr(mapping, cls.name), member.name), (cls.name, member.name)
