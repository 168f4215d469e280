"""The fork's C++ tokenizer (``tokenizer.json``): HF encode, rebuilt spacing on decode.

See docs/ARCHITECTURE.md, Eras: Tokenizers.

Its pre-tokenizer throws whitespace away, so the fork decodes by re-inserting spaces with
BERT-like heuristics for C++ (``CppTokenizer.decode`` in apstenku123/nanochat). Models trained
with it saw text re-spaced that way, so :meth:`CppTokenizer.decode` applies the same rules; they
are restated below as a left-to-right fold over adjacent token pairs, which makes the result
deterministic and means appending tokens never changes text already decoded.

Two deliberate differences from the fork:

* ``encode`` does not let control-token names typed in user text (``<BOS>``, ``<CODE_END>``...)
  become control tokens; they are encoded as the ordinary pieces ``<``, ``BOS``, ``>``.
* ``<TOOL_RESULT>`` is looked up by name; the committed file only has ``<RESERVED_19>`` at id 19,
  which is accepted in its place with a warning (the fork silently assumed id 19).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from desktop.engine.errors import TokenizerError
from desktop.engine.files.tokenizer_checks import (
    checked_tokenizer_json,
    encode_in_chunks,
    rust_errors,
    rust_tokenizer_digest,
    utf8_encodable,
)
from desktop.engine.nanochat.special_tokens import CHAT_TOKENS
from desktop.engine.text_lines import error_text

# Angle-bracket names of control tokens (<BOS>, <RESERVED_19>, nanochat-style <|bos|>). Operators
# such as <=> are added tokens too but are ordinary text.
_CONTROL_NAME = re.compile(r"<\|?[A-Za-z0-9_]+\|?>")

BOS_NAME = "<BOS>"
EOS_NAME = "<EOS>"
TOOL_RESULT_NAME = "<TOOL_RESULT>"
RESERVED_19_NAME = "<RESERVED_19>"
TOOL_RESULT_FALLBACK_ID = 19

# The fork's encode_special accepts these nanochat spellings for its own tokens.
NANOCHAT_ALIASES = {
    "<|bos|>": "<BOS>",
    "<|eos|>": "<EOS>",
    "<|pad|>": "<PAD>",
    "<|endoftext|>": "<BOS>",
    "<|code_start|>": "<CODE_START>",
    "<|code_end|>": "<CODE_END>",
    "<|thought_start|>": "<THOUGHT_START>",
    "<|thought_end|>": "<THOUGHT_END>",
    "<|query_tool|>": "<QUERY_TOOL>",
    "<|tool_result|>": "<TOOL_RESULT>",
}

UNK_TEXT = "<UNK>"  # what an id outside the vocabulary decodes to, as in the fork


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# --- data for the spacing rules (the fork's word lists) ---------------------------------------

# Operators that glue to both neighbours.
_GLUE_OPS = frozenset({"::", "->", ".*", "->*", "++", "--", "##"})
# Multi-character operators that get a space on both sides (unless an earlier rule glued them).
_SPACED_OPS = _words("""
    :: -> .* ->* ++ -- ## == != <= >= <=> && || << >> += -= *= /= %= &= |= ^= <<= >>= ... // /* */
    @@ --- +++ a/ b/
""")
# The fork tests ``token in "=+-*/%&|^~!?<>#"`` -- a substring test, so two-character runs of this
# string such as "<>" or "!?" count as operators too. Kept as a substring test on purpose.
_OPERATOR_RUN = "=+-*/%&|^~!?<>#"
# `*` and `&` after these attach as pointer/reference declarators: char* p, int& r.
_DECLARATOR_TYPES = _words("""
    void bool char short int long float double signed unsigned auto wchar_t char8_t char16_t
    char32_t size_t string vector map set list deque array pair tuple shared_ptr unique_ptr
    weak_ptr optional variant any const
""")
# `<` right after these opens a template argument list: vector<int>.
_TEMPLATE_NAMES = _words("""
    vector map set list deque array pair tuple queue stack multimap multiset unordered_map
    unordered_set shared_ptr unique_ptr weak_ptr optional variant function basic_string span
    mdspan expected template
""")
# Two-letter words that stand alone in code and prose (never treated as a word's tail).
_TWO_LETTER_WORDS = _words("is it if in or on to do no at by up an be he me my of so we us id ok fn go")
# Three- to six-letter lowercase words that are whole words, not BPE tails.
_WHOLE_WORDS = _words("""
    add ago all and any are arg ask bad bar big bit buf bus but can cap car cmd col con cpu cur day del
    did dim dir dns doc dst dup end env err ext fan far few fix fmt foo for fun gap get got gpu had has
    her hex his hit hot how hub idx img inc ini its key len let lib log low map max may mem mid min mix
    mod msg neg net new nil nop nor not now num obj odd old one opt ord our out own pad par per pid pin
    pkg pop pos pre ptr put ran raw red ref reg rem rep req res ret rev rgb row run saw say sec see set
    sim sin src std str sub sum syn sys tab tag tan tcp the tmp too top try tty two udp uid url use usr
    val var vec via vol was way web who why win xml xor yes yet zip

    also auto back base been bind body bool byte call case cast char code copy core ctrl data date dead
    deep diff disc does done down drop dump each edge edit else emit enum eval even exec exit expr face
    fail fast file fill find flag flat flip flow fold font fork form free from full func glob goes good
    goto grid grow half halt hand hash have head heap help here hide high hint hold home hook host http
    huge info init into item iter join jump just keep kern kill kind last lazy leaf left less like line
    link list live load lock long look loop lost made main make many mark mask math menu meta mode more
    most move much must mute name near need next node none norm note null only open over pack page pair
    part pass past path peek pick ping pipe plan play plot plus poll pool port post prev proc prog prop
    pull pure push quit rand rank rate read real rect redo rest ring root rule safe same save scan seed
    seek self send show shut side sign size skip slot slow snap sock some sort spec spin sqrt stat stay
    step stop such swap sync tail take task temp term test text than that them then they this tick time
    tiny todo tone tool tree trim true turn type uint undo unit unix used user very view void wait walk
    want warn what when wide will with word work wrap your zero zone

    about after again array async await begin being below block break build bytes cache catch chain
    check child chunk class clean clear close color const count cover crash debug defer delta depth
    dirty empty error event every exact extra false fetch field final first fixed flags flush focus
    force found frame front given graph green group guard guess happy heavy hence image index
    inner input inter items known label large later layer level light limit local lower magic major
    match merge minor model mouse multi mutex never newer nodes occur often older order other outer
    owned owner param parse patch pause phase pixel place plain point power press print prior probe
    proof proxy query queue quick quiet quota raise range rapid ratio ready realm refer reply reset
    retry right round route scale scene scope serve setup shape share sharp shift short since sleep
    slice small smart space spawn split stack stage start state still store strip super table taken
    their there thing think those throw timer times title token total trace track trait tries tuple
    under union until upper using utils valid value watch where which while white whole width world
    would write yield

    accept access action active actual affect always amount append assert assign atomic attach before
    better binary branch bridge broken bucket buffer bundle called cancel change client closed column
    commit common config create cursor custom daemon decode define delete deploy design detail detect
    device digest direct double driver during enable encode enough ensure entity equals escape except
    export extend extern failed family figure filter finish follow format friend frozen future gather
    global google gotten handle header height helper hidden ignore import inline insert inside invoke
    island itself launch layout length likely linear listen little loader locked logger lookup manage
    manual mapper margin marker master matrix member memory method middle module moment mostly native
    nested normal notice notify number object obtain offset online opener option origin output packet
    parent parser passed prefer public random reader reason record reduce reload remove render repair
    repeat report result resume retain return revert review rewind runner sample schema scroll search
    secure select sender server signal signed simple single sizeof socket source splice status stderr
    stdout stored stream string struct submit suffix switch symbol syntax system target thread throws
    toggle traits update upload vector verify weight widget window worker writer
""")


def _is_tag(token: str) -> bool:
    """Angle-bracketed like a control token (the fork's test, so "<>" and "<=>" qualify too)."""
    return len(token) > 1 and token.startswith("<") and token.endswith(">")


def _ends_alpha(token: str) -> bool:
    return token[-1:].isalpha()


class _Spacer:
    """Decides, pair by pair and left to right, whether a space goes between two tokens.

    Two bits of state carry from one pair to the next: whether we are inside an identifier built
    around underscores (``end _ po int`` → ``end_point``), and whether the previous token was
    glued on as a one- or two-letter word tail (``check po int`` → ``checkpoint``).
    """

    def __init__(self, added_ids: frozenset[int]) -> None:
        self._added = added_ids
        self._in_identifier = False
        self._after_short_tail = False

    def is_word_tail(self, tok: str, tok_id: int, prev: str, prev_id: int) -> bool:
        """True for a lowercase BPE fragment that continues the previous word (``ype``, ``s``)."""
        if tok_id in self._added or not tok.isalpha() or not tok.islower():
            return False
        if len(tok) > 2:
            return tok not in _WHOLE_WORDS and len(tok) <= 6
        if not _ends_alpha(prev):
            return False
        if prev_id in self._added:
            # After a keyword only plural/past-tense letters (chars, signed) or uncommon pairs glue.
            return tok in ("s", "d") if len(tok) == 1 else tok not in _TWO_LETTER_WORDS
        if not prev.isalpha():
            return False
        if len(tok) == 1 and "a" <= tok <= "z":
            # A lone letter after a short fragment is probably the word's last letter; after a
            # longer word it is more likely a variable name.
            return len(prev) <= 4 and prev not in _TWO_LETTER_WORDS
        return not (len(tok) == 2 and tok in _TWO_LETTER_WORDS)

    def space_between(self, prev: str, prev_id: int, tok: str, tok_id: int) -> bool:
        after_short_tail = self._after_short_tail
        self._after_short_tail = False
        if tok in ("\n", "\n\n") or prev in ("\n", "\n\n") or _is_tag(tok) or _is_tag(prev):
            self._in_identifier = False
            return False
        # Underscores are their own tokens; they glue identifier parts together (is _ prime).
        if tok == "_" and (prev[-1:].isalnum() or prev == "_"):
            self._in_identifier = True
            return False
        if prev == "_" and (tok[:1].isalnum() or tok == "_"):
            self._in_identifier = True
            return False
        if self._in_identifier and tok.isalpha() and _ends_alpha(prev):
            return False
        self._in_identifier = False
        if _ends_alpha(prev) and self.is_word_tail(tok, tok_id, prev, prev_id):
            self._after_short_tail = len(tok) <= 2
            return False
        if after_short_tail and tok.isalpha() and _ends_alpha(prev):
            return False
        return self._punctuation_space(prev, prev_id, tok, tok_id)

    def _punctuation_space(self, prev: str, prev_id: int, tok: str, tok_id: int) -> bool:
        if tok in _GLUE_OPS or prev in _GLUE_OPS or tok == "." or prev == ".":
            return False
        if prev in ("(", "[") or tok in (")", "]", ";", ",", "(", "["):
            return False
        if tok == "{":
            return True
        # Template brackets hug their contents: vector<int>; comparisons (i < n) keep spaces.
        if (tok == "<" and prev in _TEMPLATE_NAMES) or (tok == ">" and prev_id in self._added):
            return False
        if prev == "<" and tok_id in self._added:
            return False
        if tok in ("*", "&") and prev in _DECLARATOR_TYPES:
            return False
        if tok in _SPACED_OPS or prev in _SPACED_OPS or tok in _OPERATOR_RUN or prev in _OPERATOR_RUN:
            return True
        return tok != ":"


class CppTokenizer:
    """The fork's C++ tokenizer behind the common ``Tokenizer`` interface."""

    kind = "cpp"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Read and checked as plain JSON first: some settings abort the process inside Rust.
        text, warnings = checked_tokenizer_json(self.path)
        self.warnings: list[str] = warnings
        with rust_errors(self.path, "reading tokenizer.json"):
            try:
                self._hf = HFTokenizer.from_str(text)
            except Exception as exc:  # tokenizers raises plain Exception for bad JSON or models
                raise TokenizerError(f"{self.path}: not a valid tokenizer.json ({error_text(exc)})") from None
            vocab = self._hf.get_vocab(with_added_tokens=True)
            added = self._hf.get_added_tokens_decoder()
        with rust_errors(self.path, "encoding a test text"):  # fail at load, not mid-chat
            self._hf.encode("int main() { return a->b + 1; }\n", add_special_tokens=False)
        if not vocab:
            raise TokenizerError(f"{self.path}: tokenizer.json has an empty vocabulary")
        self._id_to_token = {i: t for t, i in vocab.items()}
        self._added_ids = frozenset(added)
        self._controls = {t.content: i for i, t in added.items() if _CONTROL_NAME.fullmatch(t.content)}
        self._control_names = {i: name for name, i in self._controls.items()}
        self._control_pattern = (
            re.compile("|".join(re.escape(n) for n in sorted(self._controls, key=len, reverse=True)))
            if self._controls
            else None
        )
        # The model's embedding must cover every id, so the size is the largest id + 1.
        self.vocab_size = max(vocab.values()) + 1
        bos = self._controls.get(BOS_NAME)
        if bos is None:
            raise TokenizerError(f"{self.path}: no {BOS_NAME} token; this is not the fork's C++ tokenizer")
        self.bos_id = bos
        self.stop_ids = frozenset(i for i in (self._controls.get(EOS_NAME), bos) if i is not None)
        self.has_chat_tokens = all(self._controls.get(name) is not None for name in CHAT_TOKENS)
        self._tool_result_warned = False

    def encode(self, text: str, cancel: threading.Event | None = None) -> list[int]:
        with rust_errors(self.path, "encoding"):
            return encode_in_chunks(self._encode, utf8_encodable(text), cancel, self.path)

    def _encode(self, text: str) -> list[int]:
        if self._control_pattern is None:
            return self._hf.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        pos = 0
        for m in self._control_pattern.finditer(text):
            # "<NAME>" typed by the user: encode "<" on its own so the name cannot match a
            # control token, giving the same pieces the punctuation split would give.
            for piece in (text[pos : m.start()], "<", m.group()[1:]):
                ids.extend(self._hf.encode(piece, add_special_tokens=False).ids)
            pos = m.end()
        ids.extend(self._hf.encode(text[pos:], add_special_tokens=False).ids)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text with the fork's spacing rules; the same ids always give the same text."""
        tokens = [self._id_to_token.get(i, UNK_TEXT) for i in ids]
        if not tokens:
            return ""
        spacer = _Spacer(self._added_ids)
        out = [tokens[0]]
        for k in range(1, len(tokens)):
            if spacer.space_between(tokens[k - 1], ids[k - 1], tokens[k], ids[k]):
                out.append(" ")
            out.append(tokens[k])
        return "".join(out)

    def special_id(self, name: str) -> int | None:
        name = NANOCHAT_ALIASES.get(name, name) if name not in self._controls else name
        found = self._controls.get(name)
        if found is None and name == TOOL_RESULT_NAME:
            return self._tool_result_fallback()
        return found

    def _tool_result_fallback(self) -> int | None:
        if self._id_to_token.get(TOOL_RESULT_FALLBACK_ID) != RESERVED_19_NAME:
            return None
        if not self._tool_result_warned:
            self._tool_result_warned = True
            self.warnings.append(
                f"{self.path}: no {TOOL_RESULT_NAME} token; using id {TOOL_RESULT_FALLBACK_ID} "
                f"({RESERVED_19_NAME}) as the fork's code does"
            )
        return TOOL_RESULT_FALLBACK_ID

    def special_name(self, id: int) -> str | None:
        return self._control_names.get(id)

    def content_digest(self) -> str:
        """What the ids mean, by content (see :func:`rust_tokenizer_digest`)."""
        return rust_tokenizer_digest(self._hf)
