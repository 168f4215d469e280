"""Walk a pickle's opcodes, without building anything, before an unpickler may see it.

``torch.load(weights_only=True)`` and the tokenizer's restricted unpickler refuse the classes they
do not know, but only once they meet them: before that they build whatever the opcodes say. A
pickle can nest tuples a million deep (hashing or freeing them overflows the C stack: SIGSEGV),
declare a 6 GB string in a 1 KB file, call ``bytearray(6_000_000_000)`` through an allowed name,
or be cut off mid-opcode (``KeyError``, ``IndexError``, ``struct.error`` from deep inside). This
module simulates the pickle machine on stand-ins (:class:`_Item`) instead:

* every opcode is checked against the stack and the memo (a corrupt or truncated pickle is named
  as such, never a stray ``KeyError``);
* nesting depth, open marks, stack size, memo size and opcode count are bounded;
* strings and byte arrays cannot declare more bytes than the file has (the data is read into
  memory first, at most ``Policy.max_bytes``, so a declared size is never allocated);
* every global must be on the policy's allowlist, and only the callable ones may be called.

For torch files it also reads what ``data.pkl`` says of each tensor (dtype, shape, storage), so
the checkpoint can be judged, and summarised, before torch runs at all (:mod:`.torch_files`).
"""

from __future__ import annotations

import io
import pickletools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from desktop.engine.files.bounded import FileMissing, FileRefused, read_bytes
from desktop.engine.files.pickle_policy import (
    DCP_POLICY,
    DTYPE_SIZES,
    ORDERED_DICT,
    REBUILD_PARAMETER,
    REBUILD_V2,
    REBUILD_V3,
    STORAGE_TYPES,
    TOKENIZER_POLICY,
    TORCH_POLICY,
    Policy,
)


class PickleRefused(ValueError):
    """Why a pickle was refused, in one line without the file name.

    ``kind``: "corrupt" (not a well-formed pickle), "limit" (a size or nesting bound),
    "construct" (well-formed, but a construct the file's kind never holds; ``reason`` names it) or
    "global" (a name not on the allowlist, in ``name``; ``reason`` then says what it stands for
    when that is known).
    """

    def __init__(self, kind: str, reason: str, name: str = "") -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.name = name


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as ``data.pkl`` describes it."""

    dtype: str  # "float32", "bfloat16", ... (torch's name without "torch.")
    shape: tuple[int, ...]
    storage: str  # the record key under data/

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def nbytes(self) -> int:
        return self.numel() * DTYPE_SIZES.get(self.dtype, 1)


# --- the simulated pickle machine ---------------------------------------------------------------

_MAX_KEPT_STR = 1024  # strings longer than this are only counted (none of the checks need them)
_MAX_KEPT_TUPLE = 16  # tuples longer than this keep no items (tensor arguments are 6-8 long)
_INT64 = 1 << 63
# Opcodes that push one plain value (genops has decoded it into ``arg``; a bool for NEWTRUE /
# NEWFALSE comes as None, which no check needs) and opcodes that remember the top of the stack.
_ATOM_OPS = frozenset(
    {
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
    }
)
_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_CODE2OP = {op.code.encode("latin-1")[0]: op for op in pickletools.opcodes}
# Opcodes whose argument is text lines that pickletools' readers unescape: a backslash before
# anything Python's string escapes do not know is refused before they run, since unescaping it
# warns (a DeprecationWarning, an error where warnings are errors) rather than failing.
_LINE_ARG_COUNT = {"GLOBAL": 2, "INST": 2, "PERSID": 1, "STRING": 1}
_ESCAPE = re.compile(rb"\\(.?)", re.DOTALL)  # a backslash and what it escapes, pairs left to right
_KNOWN_ESCAPES = frozenset(b"\\'\"abfnrtv01234567x\n")
# Opcodes decoded inline: code -> (name, bytes of the little-endian argument, and for strings
# whether the argument is the length of "unicode" text or of "bytes" that follow).
_FAST_ARGS: dict[int, tuple[str, int, str]] = {
    ord("C"): ("SHORT_BINBYTES", 1, "bytes"),
    ord("B"): ("BINBYTES", 4, "bytes"),
    0x8C: ("SHORT_BINUNICODE", 1, "unicode"),
    ord("X"): ("BINUNICODE", 4, "unicode"),
    ord("K"): ("BININT1", 1, ""),
    ord("M"): ("BININT2", 2, ""),
    ord("J"): ("BININT", 4, ""),
    ord("q"): ("BINPUT", 1, ""),
    ord("r"): ("LONG_BINPUT", 4, ""),
    ord("h"): ("BINGET", 1, ""),
    ord("j"): ("LONG_BINGET", 4, ""),
}


_NOUNS = {"atom": "plain value", "global": "global name", "object": "built object"}


def noun(kind: str) -> str:
    """How a message names an item kind: "plain value", "list", "dict", "tensor"..."""
    return _NOUNS.get(kind, kind)


class _Item:
    """What an object would be, as far as the checks care: its kind, nesting depth and, for
    short strings, small ints, tuples, globals, storages and tensors, its value."""

    __slots__ = ("depth", "kind", "ordered", "value")

    def __init__(self, kind: str, depth: int = 0, value: object = None) -> None:
        self.kind = kind
        self.depth = depth
        self.value = value
        self.ordered = False  # a collections.OrderedDict whose state was not set yet (see op_BUILD)


# Every bytes object is the same stand-in: atoms are never changed, and no check needs their value.
_BYTES = _Item("atom")


@dataclass
class _Storage:
    dtype: str
    itemsize: int
    key: str
    numel: int  # elements of dtype (bytes for an untyped storage)


class _Machine:
    def __init__(self, policy: Policy, records: Mapping[str, int] | None) -> None:
        self.policy = policy
        # storage key -> bytes in the archive (torch zip files). None in torch's legacy stream,
        # whose storages follow the pickle: each is recorded in ``declared`` and checked after.
        self.records = records
        self.declared: dict[str, _Storage] = {}
        self.end = 0  # the position after STOP
        self.stack: list[_Item] = []
        self.marks: list[int] = []
        self.memo: dict[int, _Item] = {}

    def run(self, data: bytes, start: int = 0) -> _Item:
        # Length-prefixed strings, small ints and memo reads/writes are most of a pickle (a
        # tokenizer is ~3 of them per token), so they are decoded here directly; every other
        # opcode is decoded by pickletools' own argument readers and goes to its op_ method.
        stack, marks, memo, handlers = self.stack, self.marks, self.memo, _HANDLERS
        max_ops, max_stack, max_memo = self.policy.max_ops, self.policy.max_stack, self.policy.max_memo
        reader = io.BytesIO(data)
        pos, end, ops = start, len(data), 0
        try:
            while pos < end:
                code, at = data[pos], pos
                ops += 1
                if ops > max_ops:
                    raise PickleRefused("limit", f"the pickle has more than {max_ops} opcodes")
                # The three opcodes of every tokenizer entry (bytes key, memo, int rank) first.
                # Anything unusual (cut off, a limit reached) falls through to the general path,
                # which says what is wrong.
                if code == 0x43 and pos + 1 < end:  # SHORT_BINBYTES
                    stop = pos + 2 + data[pos + 1]
                    if stop <= end and len(stack) < max_stack:
                        stack.append(_BYTES)
                        pos = stop
                        continue
                elif code == 0x94:  # MEMOIZE
                    if stack and not (marks and len(stack) <= marks[-1]) and len(memo) < max_memo:
                        memo[len(memo)] = stack[-1]
                        pos += 1
                        continue
                elif code == 0x4D and pos + 2 < end and len(stack) < max_stack:  # BININT2
                    stack.append(_Item("atom", 0, data[pos + 1] | data[pos + 2] << 8))
                    pos += 3
                    continue
                fast = _FAST_ARGS.get(code)
                if fast is not None:
                    name, width, what = fast
                    start = pos + 1 + width
                    if start > end:
                        raise PickleRefused("corrupt", f"the pickle is cut off (in {name} at byte {pos})")
                    arg: object = int.from_bytes(data[pos + 1 : start], "little", signed=name == "BININT")
                    if what:  # a string: arg was its length
                        size = arg
                        pos = start + size  # type: ignore[operator]
                        if pos > end:
                            raise PickleRefused(
                                "corrupt",
                                f"the pickle is cut off (expected {size} bytes in a {what}, "
                                f"but only {end - start} remain)",
                            )
                        arg = data[start:pos].decode("utf-8", "surrogatepass") if what == "unicode" else None
                    else:
                        pos = start
                else:
                    opcode = _CODE2OP.get(code)
                    if opcode is None:
                        raise PickleRefused(
                            "corrupt", f"the pickle is malformed (unknown opcode {code:#04x} at byte {pos})"
                        )
                    name = opcode.name
                    if opcode.arg is None:
                        arg = None
                        pos += 1
                    else:
                        reader.seek(pos + 1)
                        if name in _LINE_ARG_COUNT:
                            _refuse_unknown_escapes(reader, _LINE_ARG_COUNT[name], pos)
                        arg = opcode.arg.reader(reader)
                        pos = reader.tell()
                if name in _ATOM_OPS:
                    if len(stack) >= max_stack:
                        raise PickleRefused("limit", f"the pickle holds more than {max_stack} items at once")
                    keep = (
                        (type(arg) is int and -1 < arg < _INT64)  # type: ignore[operator]
                        or (type(arg) is str and len(arg) <= _MAX_KEPT_STR)  # type: ignore[arg-type]
                        or type(arg) in (float, bool)
                    )
                    stack.append(_Item("atom", 0, arg if keep else None))
                    continue
                if name in _MEMO_OPS:
                    if not stack or (marks and len(stack) <= marks[-1]):
                        raise PickleRefused("corrupt", f"{name} at byte {at} finds nothing to remember")
                    memo[len(memo) if arg is None else arg] = stack[-1]  # type: ignore[index]
                    if len(memo) > max_memo:
                        raise PickleRefused("limit", f"the pickle remembers more than {max_memo} objects")
                    continue
                if name == "STOP":
                    self.end = pos
                    return self._stop(at)
                handler = handlers.get(name)
                if handler is None:
                    raise PickleRefused("corrupt", f"opcode {name} at byte {at} is not allowed")
                try:
                    handler(self, arg)
                except IndexError:
                    raise PickleRefused("corrupt", f"{name} at byte {at} finds too few items") from None
        except PickleRefused:
            raise
        except (ValueError, UnicodeDecodeError) as exc:  # an argument reader: cut off, bad text
            raise PickleRefused("corrupt", _genops_reason(exc)) from None
        raise PickleRefused("corrupt", "the pickle ends without a STOP opcode")

    def _stop(self, pos: int | None) -> _Item:
        if len(self.stack) != 1 or self.marks:
            raise PickleRefused(
                "corrupt", f"the pickle stops at byte {pos} with {len(self.stack)} items left"
            )
        return self.stack[0]

    # -- helpers --

    def push(self, item: _Item) -> None:
        if item.depth > self.policy.max_depth:
            raise PickleRefused(
                "limit", f"the pickle nests containers deeper than {self.policy.max_depth} levels"
            )
        self.stack.append(item)
        if len(self.stack) > self.policy.max_stack:
            raise PickleRefused("limit", f"the pickle holds more than {self.policy.max_stack} items at once")

    def pop(self) -> _Item:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise IndexError
        return self.stack.pop()

    def pop_mark(self) -> list[_Item]:
        if not self.marks:
            raise PickleRefused("corrupt", "the pickle closes a MARK it never opened")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self) -> _Item:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise IndexError
        return self.stack[-1]

    def container(self, kind: str, items: list[_Item]) -> _Item:
        depth = 1 + max((i.depth for i in items), default=0)
        value = tuple(items) if kind == "tuple" and len(items) <= _MAX_KEPT_TUPLE else None
        return _Item(kind, depth, value)

    def grow(self, target: _Item, kinds: tuple[str, ...], items: list[_Item], opname: str) -> None:
        if target.kind not in kinds:
            raise PickleRefused("corrupt", f"{opname} adds items to a {noun(target.kind)}, not a {kinds[0]}")
        depth = 1 + max((i.depth for i in items), default=0)
        if depth > target.depth:
            target.depth = depth
            if depth > self.policy.max_depth:
                raise PickleRefused(
                    "limit", f"the pickle nests containers deeper than {self.policy.max_depth} levels"
                )

    def check_global(self, module: object, name: object) -> _Item:
        if not isinstance(module, str) or not isinstance(name, str):
            raise PickleRefused("corrupt", "a global's module or name is not text")
        key = (module, name)
        if key in self.policy.callables or key in self.policy.values:
            return _Item("global", 0, key)
        reason = self.policy.explained.get(key, "")
        raise PickleRefused("global", reason, f"{module}.{name}")

    def call(self, func: _Item, args: _Item, opname: str) -> _Item:
        if func.kind != "global":
            raise PickleRefused("global", "", f"a computed {noun(func.kind)} (called by {opname})")
        if func.value not in self.policy.callables:
            named: tuple[str, str] = func.value  # type: ignore[assignment]
            raise PickleRefused("global", "only allowed as a value, never called", ".".join(named))
        if args.kind != "tuple":
            raise PickleRefused("corrupt", f"{opname} arguments are a {noun(args.kind)}, not a tuple")
        if func.value == ORDERED_DICT:
            item = _Item("dict", 1 + args.depth, [])
            item.ordered = True
            return item
        if func.value in (REBUILD_V2, REBUILD_V3):
            return _Item("tensor", 1 + args.depth, self.tensor(func.value, args))
        if func.value == REBUILD_PARAMETER:
            data = args.value[0] if args.value else None  # type: ignore[index]
            if data is None or data.kind != "tensor":
                raise PickleRefused("corrupt", "a parameter is rebuilt from something that is not a tensor")
            return _Item("tensor", 1 + args.depth, data.value)
        return _Item("object", 1 + args.depth)

    def tensor(self, func: object, args: _Item) -> TensorInfo:
        """Check a ``_rebuild_tensor_v2/v3`` call's arguments against its storage."""
        parts = args.value
        v3 = func == REBUILD_V3
        if not isinstance(parts, tuple) or len(parts) not in ((7, 8) if v3 else (6, 7)):
            raise PickleRefused("corrupt", "a tensor is rebuilt with the wrong number of arguments")
        storage, offset, size, stride = (p.value for p in parts[:4])
        if not isinstance(storage, _Storage):
            raise PickleRefused("corrupt", "a tensor is rebuilt from something that is not a storage")
        shape, strides = _int_tuple(size), _int_tuple(stride)
        if shape is None or strides is None or len(shape) != len(strides) or not _small_int(offset):
            raise PickleRefused("corrupt", "a tensor has a malformed size, stride or offset")
        dtype, itemsize, numel = storage.dtype, storage.itemsize, storage.numel
        if v3:
            named = parts[6].value
            if parts[6].kind != "global" or named[0] != "torch" or named[1] not in DTYPE_SIZES:  # type: ignore[index]
                raise PickleRefused("corrupt", "a tensor names no dtype")
            dtype, itemsize = named[1], DTYPE_SIZES[named[1]]  # type: ignore[index]
            numel = storage.numel * storage.itemsize // itemsize
        if 0 not in shape:
            last = offset + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))  # type: ignore[operator]
            if last >= numel:
                raise PickleRefused(
                    "corrupt",
                    f"a tensor of shape {list(shape)} reaches element {last} of storage "
                    f"'{storage.key}', which holds {numel}",
                )
        return TensorInfo(dtype, shape, storage.key)

    def storage(self, pid: _Item) -> _Item:
        parts = pid.value
        # The zip format's id has 5 parts; the legacy stream's a 6th, a view of another
        # storage, which torch has not written since 2018 (None).
        legacy = self.records is None
        if pid.kind != "tuple" or not isinstance(parts, tuple) or len(parts) != 5 + legacy:
            raise PickleRefused("corrupt", f"a persistent id is not torch's {5 + legacy}-part storage tuple")
        if legacy and (parts[5].kind != "atom" or parts[5].value is not None):
            raise PickleRefused("construct", "it holds a storage view, which only torch before 1.0 writes")
        tag, kind, key, _location, numel = (p.value for p in parts[:5])
        if tag != "storage" or parts[1].kind != "global" or kind not in STORAGE_TYPES:
            raise PickleRefused("corrupt", "a persistent id is not a torch storage")
        if not isinstance(key, str) or not _small_int(numel):
            raise PickleRefused("corrupt", "a storage has a malformed key or size")
        dtype, itemsize = STORAGE_TYPES[kind]  # type: ignore[index]
        found = _Storage(dtype, itemsize, key, numel)  # type: ignore[arg-type]
        if self.records is None:  # legacy: its record follows the pickle, checked by the caller
            if self.declared.setdefault(key, found) != found:
                raise PickleRefused("corrupt", f"storage '{key}' is declared twice, differently")
            return _Item("storage", 0, found)
        available = self.records.get(key)
        if available is None:
            raise PickleRefused("corrupt", f"storage '{key}' has no data record in the archive")
        if numel * itemsize > available:  # type: ignore[operator]
            raise PickleRefused(
                "corrupt",
                f"storage '{key}' declares {numel * itemsize} bytes but its record holds {available}",  # type: ignore[operator]
            )
        return _Item("storage", 0, found)

    # -- opcodes (op_<NAME>(arg)); STOP is handled in run() --

    def op_PROTO(self, arg: object) -> None:
        if not isinstance(arg, int) or arg > 5:
            raise PickleRefused("corrupt", f"unknown pickle protocol {arg}")

    def op_FRAME(self, arg: object) -> None:
        pass  # genops reads the frame's contents as ordinary opcodes; sizes are checked by each

    def op_MARK(self, arg: object) -> None:
        self.marks.append(len(self.stack))
        if len(self.marks) > self.policy.max_marks:
            raise PickleRefused("limit", f"the pickle opens more than {self.policy.max_marks} nested MARKs")

    def op_POP_MARK(self, arg: object) -> None:
        self.pop_mark()

    def op_POP(self, arg: object) -> None:
        self.pop()

    def op_DUP(self, arg: object) -> None:
        self.push(self.top())

    def op_EMPTY_TUPLE(self, arg: object) -> None:
        self.push(_Item("tuple", 1, ()))

    def op_EMPTY_LIST(self, arg: object) -> None:
        self.push(_Item("list", 1))

    def op_EMPTY_DICT(self, arg: object) -> None:
        self.push(_Item("dict", 1, []))

    def op_EMPTY_SET(self, arg: object) -> None:
        self.push(_Item("set", 1))

    def op_TUPLE(self, arg: object) -> None:
        self.push(self.container("tuple", self.pop_mark()))

    def _tuple_n(self, n: int) -> None:
        items = [self.pop() for _ in range(n)][::-1]
        self.push(self.container("tuple", items))

    def op_TUPLE1(self, arg: object) -> None:
        self._tuple_n(1)

    def op_TUPLE2(self, arg: object) -> None:
        self._tuple_n(2)

    def op_TUPLE3(self, arg: object) -> None:
        self._tuple_n(3)

    def op_LIST(self, arg: object) -> None:
        self.push(self.container("list", self.pop_mark()))

    def op_FROZENSET(self, arg: object) -> None:
        self.push(self.container("frozenset", self.pop_mark()))

    def op_DICT(self, arg: object) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise PickleRefused("corrupt", "DICT has a key without a value")
        item = self.container("dict", items)
        item.value = self._entries(items)
        self.push(item)

    def op_APPEND(self, arg: object) -> None:
        value = self.pop()
        self.grow(self.top(), ("list",), [value], "APPEND")

    def op_APPENDS(self, arg: object) -> None:
        items = self.pop_mark()
        self.grow(self.top(), ("list",), items, "APPENDS")

    def op_ADDITEMS(self, arg: object) -> None:
        items = self.pop_mark()
        self.grow(self.top(), ("set",), items, "ADDITEMS")

    def op_SETITEM(self, arg: object) -> None:
        value = self.pop()
        key = self.pop()
        self._set_items(self.top(), [key, value], "SETITEM")

    def op_SETITEMS(self, arg: object) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise PickleRefused("corrupt", "SETITEMS has a key without a value")
        self._set_items(self.top(), items, "SETITEMS")

    def _set_items(self, target: _Item, items: list[_Item], opname: str) -> None:
        self.grow(target, ("dict",), items, opname)
        entries = self._entries(items)
        if entries is not None and isinstance(target.value, list):
            target.value.extend(entries)

    def _entries(self, items: list[_Item]) -> list[tuple[object, _Item]] | None:
        """(key, value) pairs where the policy reads entries (torch: the state dict's tensors)."""
        if not self.policy.persistent_ids:
            return None
        return [
            (items[i].value if items[i].kind == "atom" else None, items[i + 1])
            for i in range(0, len(items), 2)
        ]

    def op_GET(self, arg: object) -> None:
        item = self.memo.get(arg)  # type: ignore[call-overload]
        if item is None:
            raise PickleRefused("corrupt", f"the pickle reads memo slot {arg}, which was never written")
        self.push(item)

    op_BINGET = op_LONG_BINGET = op_GET

    def op_GLOBAL(self, arg: object) -> None:
        module, _, name = str(arg).partition(" ")
        self.push(self.check_global(module, name))

    def op_STACK_GLOBAL(self, arg: object) -> None:
        name = self.pop()
        module = self.pop()
        self.push(self.check_global(module.value, name.value))

    def op_INST(self, arg: object) -> None:
        module, _, name = str(arg).partition(" ")
        func = self.check_global(module, name)
        self.push(self.call(func, self.container("tuple", self.pop_mark()), "INST"))

    def op_OBJ(self, arg: object) -> None:
        items = self.pop_mark()
        if not items:
            raise PickleRefused("corrupt", "OBJ has no class")
        self.push(self.call(items[0], self.container("tuple", items[1:]), "OBJ"))

    def op_REDUCE(self, arg: object) -> None:
        args = self.pop()
        func = self.pop()
        self.push(self.call(func, args, "REDUCE"))

    def op_NEWOBJ(self, arg: object) -> None:
        args = self.pop()
        cls = self.pop()
        self.push(self.call(cls, args, "NEWOBJ"))

    def op_NEWOBJ_EX(self, arg: object) -> None:
        kwargs = self.pop()
        args = self.pop()
        cls = self.pop()
        result = self.call(cls, args, "NEWOBJ_EX")
        result.depth = max(result.depth, 1 + kwargs.depth)
        self.push(result)

    def op_BUILD(self, arg: object) -> None:
        state = self.pop()
        target = self.top()
        if target.kind == "dict" and target.ordered and self.policy.state_dict_metadata:
            _check_state_dict_metadata(state)
            target.ordered = False  # one BUILD per OrderedDict, as pickle writes it
        elif target.kind != "object":
            raise PickleRefused(
                "construct",
                f"it sets attributes on a {noun(target.kind)} (pickle BUILD); a saved state dict "
                "sets only the '_metadata' of its OrderedDict",
            )
        target.depth = max(target.depth, 1 + state.depth)
        if target.depth > self.policy.max_depth:
            raise PickleRefused(
                "limit", f"the pickle nests containers deeper than {self.policy.max_depth} levels"
            )

    def op_BINPERSID(self, arg: object) -> None:
        pid = self.pop()
        if not self.policy.persistent_ids:
            raise PickleRefused("corrupt", "persistent ids are not allowed in this file")
        self.push(self.storage(pid))

    def op_PERSID(self, arg: object) -> None:
        raise PickleRefused("corrupt", "text persistent ids are not allowed")

    def _extension(self, arg: object) -> None:
        raise PickleRefused("global", "", f"extension code {arg}")

    op_EXT1 = op_EXT2 = op_EXT4 = _extension

    def _buffer(self, arg: object) -> None:
        raise PickleRefused("corrupt", "out-of-band buffers are not allowed")

    op_NEXT_BUFFER = op_READONLY_BUFFER = _buffer


def _small_int(value: object) -> bool:
    """A non-negative int that fits in 64 bits (bool excluded)."""
    return type(value) is int and 0 <= value < 1 << 63


def _int_tuple(item: object) -> tuple[int, ...] | None:
    if not isinstance(item, tuple) or not all(isinstance(i, _Item) and _small_int(i.value) for i in item):
        return None
    return tuple(i.value for i in item)  # type: ignore[misc]


# nn.Module.state_dict() records {"version": module._version} per module (plus what a module's
# own state-dict hook adds, which nothing nanochat uses does); a few keys is generous.
_MAX_METADATA_FIELDS = 8


def _check_state_dict_metadata(state: _Item) -> None:
    """The state a state dict's BUILD may set: ``{'_metadata': OrderedDict(path -> {str: int})}``.

    Anything else (another attribute, a value that is not a small table of ints) is refused: it
    would be an object's state smuggled onto a dict, not something torch writes.
    """
    entries = state.value if state.kind == "dict" else None
    if not isinstance(entries, list) or len(entries) != 1 or entries[0][0] != "_metadata":
        raise PickleRefused(
            "construct",
            "it sets attributes other than '_metadata' on its OrderedDict (pickle BUILD); "
            "a saved state dict carries only that one",
        )
    table = entries[0][1]
    rows = table.value if table.kind == "dict" else None
    if not isinstance(rows, list):
        raise PickleRefused("construct", "its state dict's '_metadata' is not a table (pickle BUILD)")
    for path, row in rows:
        fields = row.value if row.kind == "dict" and not row.ordered else None
        if (
            not isinstance(path, str)
            or not isinstance(fields, list)
            or len(fields) > _MAX_METADATA_FIELDS
            or not all(isinstance(k, str) and _small_int(v.value) for k, v in fields)
        ):
            raise PickleRefused(
                "construct",
                "its state dict's '_metadata' holds something other than module names with a few "
                "integer fields (pickle BUILD)",
            )


def _genops_reason(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    if "exhausted" in text or "but only" in text or "not enough data" in text:
        return f"the pickle is cut off ({text[:160]})"
    if "digits" in text:
        return "the pickle holds a number with thousands of digits"
    return f"the pickle is malformed ({text[:160]})"


# opcode name -> its method. A table of the class's functions, not of each machine's bound methods:
# those would hold the machine in a reference cycle, and its memo until the cyclic collector ran.
_HANDLERS: dict[str, Callable[[_Machine, object], None]] = {
    name[3:]: function for name, function in vars(_Machine).items() if name.startswith("op_")
}


# --- the files ------------------------------------------------------------------------------------


def scan_bytes(data: bytes, policy: Policy, records: Mapping[str, int] | None = None) -> _Item:
    """Check one pickle held in memory; raises :class:`PickleRefused`. Returns its top object."""
    if len(data) > policy.max_bytes:
        raise PickleRefused("limit", f"the pickle is {len(data)} bytes (limit {policy.max_bytes})")
    return _Machine(policy, records).run(data)


def scan_at(data: bytes, start: int, policy: Policy) -> int:
    """Check the pickle that starts at ``data[start]`` (more may follow it); returns the
    position after its STOP."""
    machine = _Machine(policy, None)
    machine.run(data, start)
    return machine.end


@dataclass(frozen=True)
class StateDictPickle:
    """What one torch pickle holds, for :mod:`.torch_files`."""

    entries: tuple[tuple[object, TensorInfo | str], ...]  # (key, tensor or the kind of non-tensor)
    top: str  # the kind of the top object ("dict" for a state dict)
    end: int  # the position after its STOP
    # storage key -> (elements, bytes per element), when the storages follow the pickle (legacy)
    storages: Mapping[str, tuple[int, int]]


def scan_torch_pickle(
    data: bytes, records: Mapping[str, int] | None = None, start: int = 0
) -> StateDictPickle:
    """Check the pickle at ``data[start:]`` under :data:`TORCH_POLICY`.

    ``records``: each storage's bytes in a zip archive, checked against what the pickle declares;
    None for torch's legacy stream, where the declared storages are returned to be checked.
    """
    machine = _Machine(TORCH_POLICY, records)
    top = machine.run(data, start)
    entries = tuple(
        (key, item.value if item.kind == "tensor" else item.kind)
        for key, item in (top.value if top.kind == "dict" and isinstance(top.value, list) else ())
    )
    storages = {k: (s.numel, s.itemsize) for k, s in machine.declared.items()}
    return StateDictPickle(entries, top.kind, machine.end, storages)  # type: ignore[arg-type]


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refusing one over ``limit`` before reading it.
    Raises ``FileNotFoundError`` when it is absent, :class:`PickleRefused` for the rest."""
    try:
        return read_bytes(path, "pickle", limit)
    except FileMissing:
        raise FileNotFoundError(path) from None
    except FileRefused as exc:
        raise PickleRefused("limit", exc.reason) from None


def scan_tokenizer_pickle(path: Path) -> bytes:
    """Check a ``tokenizer.pkl``; returns its bytes (for the unpickler, so the file is read once)."""
    data = read_limited(path, TOKENIZER_POLICY.max_bytes)
    scan_bytes(data, TOKENIZER_POLICY)
    return data


def scan_dcp_metadata(path: Path) -> None:
    """Check a torch.distributed.checkpoint ``.metadata`` pickle before anything unpickles it."""
    scan_bytes(read_limited(path, DCP_POLICY.max_bytes), DCP_POLICY)


def _refuse_unknown_escapes(reader: io.BytesIO, lines: int, at: int) -> None:
    """Refuse the ``lines`` text lines ahead of ``reader`` (an opcode's argument at byte ``at``)
    if a backslash in them escapes nothing Python knows; the reader is left where it was."""
    start = reader.tell()
    text = b"".join(reader.readline() for _ in range(lines))
    reader.seek(start)
    if any(m.group(1) and m.group(1)[0] not in _KNOWN_ESCAPES for m in _ESCAPE.finditer(text)):
        raise PickleRefused("corrupt", f"the pickle is malformed (an unknown escape at byte {at})")
