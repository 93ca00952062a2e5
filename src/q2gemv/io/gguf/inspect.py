"""``q2gemv inspect``: a GGUF file summarised one escaped line per row."""

from __future__ import annotations

import os

from .reader import GGUF_ARRAY, escape_text, read_gguf, short_text, value_type_name


def format_inspect(path: str | os.PathLike) -> str:
    """A human-readable summary of a GGUF file: header, metadata, then one line per tensor.

    ``path`` (str or os.PathLike) names the file; returns the summary as one
    multi-line str (no trailing newline).

    Tensor lines give the name, type name, shape ``(n, k)`` (``k = ne[0]``,
    ``n`` the product of the outer dims; the stored ``ne`` is added for
    tensors of more than two dims), the group of Q2 types ("64|128?" when the
    file leaves it ambiguous), the bytes and the absolute offset. Names, keys
    and values are printed through :func:`escape_text` (control characters
    escaped), so every row is one line. Raises
    :class:`GgufError` on a malformed file, like :func:`read_gguf`.
    """
    gf = read_gguf(path)
    lines = [
        f"{escape_text(gf.path)}: GGUF v{gf.version}, {len(gf.tensors)} tensors, "
        f"{len(gf.metadata)} metadata keys, alignment {gf.alignment}, "
        f"data at byte {gf.data_offset}, {gf.file_size} bytes",
    ]
    if gf.metadata:
        lines.append("metadata:")
        rows = []
        for key, value in gf.metadata.items():
            types = gf.metadata_types[key]
            if types[0] == GGUF_ARRAY:
                tname = f"array[{value_type_name(types[1])}] x {len(value)}"
            else:
                tname = value_type_name(types[0])
            rows.append((escape_text(key), tname, short_text(value)))
        kw = max(len(r[0]) for r in rows)
        tw = max(len(r[1]) for r in rows)
        lines += [f"  {k:<{kw}}  {t:<{tw}}  {v}" for k, t, v in rows]
    if gf.tensors:
        rows = [("name", "type", "shape (n, k)", "group", "bytes", "offset")]
        total = 0
        for t in gf.tensors:
            shape = f"({t.n}, {t.k})" + (f" ne={list(t.ne)}" if len(t.ne) > 2 else "")
            if t.is_q2:
                grp = str(t.group) if t.group is not None else "|".join(map(str, t.q2_groups)) + "?"
            else:
                grp = "-"
            nb = "?" if t.nbytes is None else str(t.nbytes)
            total += t.nbytes or 0
            rows.append((escape_text(t.name), t.type_name, shape, grp, nb, str(t.offset)))
        widths = [max(len(r[c]) for r in rows) for c in range(6)]
        lines.append("tensors:")
        for r in rows:
            cells = [r[c].rjust(widths[c]) if c >= 3 else r[c].ljust(widths[c]) for c in range(6)]
            lines.append("  " + "  ".join(cells).rstrip())
        lines.append(f"total tensor bytes: {total}")
    return "\n".join(lines)
