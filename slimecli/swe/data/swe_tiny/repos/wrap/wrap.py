"""Plain-text layout: greedy word wrapping, paragraph fill, full justification, centring and shortening.

>>> wrap("the quick brown fox", 10)
['the quick', 'brown fox']
"""

from __future__ import annotations

__all__ = ["center", "fill", "justify", "shorten", "wrap"]


def _check_width(width: int) -> None:
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")


def _pieces(word: str, width: int) -> list[str]:
    """A word that fits is one piece; a longer one is cut into pieces of `width` characters (the last may be shorter)."""
    if len(word) <= width:
        return [word]
    return [word[i : i + width] for i in range(0, len(word), width)]


def wrap(text: str, width: int = 70) -> list[str]:
    """Lines of at most `width` characters, as many words on each as fit (a line may be exactly `width` long)."""
    _check_width(width)
    lines: list[str] = []
    line = ""
    for word in text.split():
        for piece in _pieces(word, width):
            if not line:
                line = piece
            elif len(line) + 1 + len(piece) <= width:
                line += " " + piece
            else:
                lines.append(line)
                line = piece
    if line:
        lines.append(line)
    return lines


def justify(line: str, width: int) -> str:
    """The words of the line spread to exactly `width` characters; when the spaces do not divide evenly the
    leftmost gaps get one more. A single word is padded on the right."""
    words = line.split()
    if len(words) < 2:
        return line.strip().ljust(width)
    gaps = len(words) - 1
    spaces = width - sum(len(word) for word in words)
    if spaces < gaps:
        raise ValueError(f"{line!r} does not fit in {width} characters")
    each, extra = divmod(spaces, gaps)
    out = words[0]
    for i, word in enumerate(words[1:]):
        out += " " * (each + (1 if i < extra else 0)) + word
    return out


def fill(text: str, width: int = 70, justified: bool = False) -> str:
    """Each paragraph (paragraphs are separated by blank lines) wrapped to `width`, joined by a blank line.
    With `justified`, every line but the last of each paragraph is justified; last lines stay ragged."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    out: list[str] = []
    for paragraph in paragraphs:
        lines = wrap(paragraph, width)
        if justified:
            last = len(lines) - 1
            lines = [justify(line, width) if i < last else line for i, line in enumerate(lines)]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def center(text: str, width: int, fillchar: str = " ") -> str:
    """Each line centred in `width` characters; when the padding is odd, the extra character goes on the right."""
    _check_width(width)
    out: list[str] = []
    for line in text.splitlines() or [""]:
        line = line.strip()
        pad = max(width - len(line), 0)
        left = pad // 2
        right = pad - left
        out.append(fillchar * left + line + fillchar * right)
    return "\n".join(out)


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """The text on one line, whitespace collapsed; if longer than `width`, whole words are dropped from the end
    and `placeholder` appended so that the result fits in `width`."""
    _check_width(width)
    words = text.split()
    if len(" ".join(words)) <= width:
        return " ".join(words)
    if len(placeholder.lstrip()) > width:
        raise ValueError(f"placeholder {placeholder!r} does not fit in {width} characters")
    kept = ""
    for word in words:
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) + len(placeholder) > width:
            break
        kept = candidate
    return kept + placeholder if kept else placeholder.lstrip()
