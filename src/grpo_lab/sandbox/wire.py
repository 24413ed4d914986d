"""The wire between the completion's process and the judge's: frames, values as data, handles, calls.

Shipped as source into both sandboxes (the standard library only, no ``from __future__``: see ``harness.py``), and
importable as ``grpo_lab.sandbox.wire`` for its own tests.

A message is a length-prefixed JSON array. Values cross as **data**: JSON's null, booleans, numbers and strings,
and tagged arrays for everything else on the allow-list (below). The receiver rebuilds them from the tags alone, so
whatever the other side sends, it gets back only builtin values of the allowed types, never an object of the
sender's classes. Anything that is not such a value crosses as a **handle** (``["H", id, kind]``): a number in the
sender's table of objects, which the receiver can only hand back (``["R", id]``) or ask the sender to operate on
(call it, read an attribute, iterate it...). Exceptions cross as the nearest builtin exception type and a message.

=====================  ==============================================================================
tag                    value
=====================  ==============================================================================
``["i", hex]``         an int too large for a JSON number (hex: no limit on its digits)
``["c", re, im]``      complex
``["b", b64]``         bytes (``"y"``: bytearray)
``["l", [...]]``       list (``"t"`` tuple; ``"s"`` set; ``"f"`` frozenset)
``["n", name, f, xs]`` a namedtuple: rebuilt as a namedtuple of the receiver's own making, fields ``f``
``["d", [k, v, ...]]`` dict (``"C"`` Counter, ``"O"`` OrderedDict; ``["D", factory, [...]]`` defaultdict)
``["q", [...], max]``  deque; ``["M", [...]]`` ChainMap; ``["r", a, b, c]`` range
``["F", num, den]``    Fraction (hex); ``["N", text]`` Decimal
``["k", [...]]``       dict keys (``"v"`` values, ``"e"`` items): the views of a dict built from them
``["H", id, kind]``    the sender's object ``id`` (of type ``kind``), as a handle
``["R", id]``          the receiver's own object ``id``, handed back
=====================  ==============================================================================

An int or str enum member, or any subclass of an allowed type, crosses as its plain value (as it compares);
a plain ``Enum`` member, an instance of the sender's own class, a function, a generator crosses as a handle.
"""

import base64
import builtins
import collections
import contextlib
import decimal
import fractions
import functools
import json
import keyword
import operator
import os
import select
import time
import types

MAX_FRAME = 1 << 25  # bytes of one message: a value larger than this fails its call, not the judge
MAX_DEPTH = 200  # nesting of one value
MESSAGE_CHARS = 1000  # of an exception's message
_SMALL_INT = 1 << 62
_FACTORIES = {f.__name__: f for f in (int, float, str, bytes, list, dict, set, frozenset, tuple, bool, complex)}
_MUTABLE = frozenset("lsdCODqyMt")  # tags of values a call may change in place (tuples: their items may be)
_LOOSE = (type(None), bool, int, float, str)  # what JSON itself carries


class WireError(Exception):
    """The other side broke the protocol, went away, or did not answer in time (see ``why``)."""

    def __init__(self, message, why="protocol"):
        Exception.__init__(self, message)
        self.why = why  # "protocol", "gone" or "timeout"


# ----------------------------------------------------------------------------------------------------- frames
def send(fd, message):
    data = json.dumps(message, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(data) > MAX_FRAME:
        raise ValueError(f"a value of more than {MAX_FRAME} bytes")
    data = len(data).to_bytes(4, "big") + data
    while data:
        try:
            data = data[os.write(fd, data) :]
        except InterruptedError:
            continue
        except OSError as e:  # EPIPE, ECONNRESET: the other side has ended
            raise WireError(f"the other side has gone: {e}", "gone") from None


def receive(fd, deadline):
    """One message, waiting until ``deadline`` (time.monotonic()); WireError if none comes whole by then."""
    size = int.from_bytes(_read(fd, 4, deadline), "big")
    if size > MAX_FRAME:
        raise WireError(f"a message of {size} bytes")
    try:
        return json.loads(_read(fd, size, deadline).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise WireError(f"not a message: {str(e)[:200]}") from None


def _read(fd, size, deadline):
    chunks, wanted, forever = [], size, deadline == float("inf")
    while wanted:
        left = None if forever else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise WireError("no answer in time", "timeout")
        try:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, min(wanted, 1 << 20))
        except InterruptedError:
            continue
        except OSError as e:
            raise WireError(f"the other side has gone: {e}", "gone") from None
        if not chunk:
            raise WireError("the other side has gone", "gone")
        chunks.append(chunk)
        wanted -= len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------------------------------- values
def encode(value, export, depth=0):
    """``value`` as data (see the module docstring); ``export(obj)`` gives a handle for what is not a value."""
    kind = type(value)
    if kind is str or kind is bool or kind is float or value is None:
        return value
    if kind is int:
        return value if -_SMALL_INT < value < _SMALL_INT else ["i", hex(value)]
    if depth > MAX_DEPTH:
        raise ValueError(f"a value nested more than {MAX_DEPTH} deep")
    if kind in _VIEWS:
        return [_VIEWS[kind], [encode(item, export, depth + 1) for item in value]]
    if isinstance(value, Remote):  # the receiver's own object, handed back
        return ["R", value._id]
    for cls, encoder in _ENCODERS:  # subclasses before their bases: a Counter is a dict, a bool an int
        if isinstance(value, cls):
            return encoder(value, export, depth + 1)
    return export(value)


def _flat(mapping, export, depth):
    flat = []
    for key, item in mapping.items():
        flat.append(encode(key, export, depth))
        flat.append(encode(item, export, depth))
    return flat


def _items(values, export, depth):
    return [encode(item, export, depth) for item in values]


def _tuple(value, export, depth):
    """A tuple, or a namedtuple with its type's name and fields (rebuilt on the other side as a namedtuple of that
    side's own making: it compares as its tuple, and `p.x` works)."""
    fields = getattr(type(value), "_fields", None)
    name = type(value).__name__
    if type(fields) is tuple and len(fields) == len(value) and _names(name, fields):
        return ["n", name, list(fields), _items(value, export, depth)]
    return ["t", _items(value, export, depth)]


_TUPLE_ATTRIBUTES = frozenset(dir(tuple))


def _names(name, fields):
    # A field may not shadow a tuple's own attribute (`count`, `index`): `r.count(3)` must stay the tuple's method.
    return (
        all(
            type(n) is str and n.isidentifier() and not keyword.iskeyword(n) and not n.startswith("_") and len(n) <= 100
            for n in (name, *fields)
        )
        and not _TUPLE_ATTRIBUTES.intersection(fields)
        and len(set(fields)) == len(fields) <= 255
    )


@functools.lru_cache(maxsize=256)
def _namedtuple(name, fields):
    return collections.namedtuple(name, fields)


def _named(parts, name, fields, items):
    if type(fields) is not list or not _names(name, fields):
        raise ValueError("not a namedtuple")
    values = parts.each(items)
    if len(values) != len(fields):
        raise ValueError("not a namedtuple")
    return _namedtuple(name, tuple(fields))(*values)


def _factory(mapping):
    factory = mapping.default_factory
    return factory.__name__ if _FACTORIES.get(getattr(factory, "__name__", "")) is factory else None


# A subclass of an allowed type crosses as its base's plain value: int.__int__ and the like skip its own methods.
_ENCODERS = (
    (bool, lambda v, e, d: bool(v)),
    (int, lambda v, e, d: encode(int.__int__(v), e)),
    (float, lambda v, e, d: float.__float__(v)),
    (str, lambda v, e, d: str.__str__(v)),
    (bytearray, lambda v, e, d: ["y", base64.b64encode(v).decode("ascii")]),
    (bytes, lambda v, e, d: ["b", base64.b64encode(v).decode("ascii")]),
    (complex, lambda v, e, d: ["c", v.real, v.imag]),
    (fractions.Fraction, lambda v, e, d: ["F", hex(v.numerator), hex(v.denominator)]),
    (decimal.Decimal, lambda v, e, d: ["N", str(v)]),
    (collections.Counter, lambda v, e, d: ["C", _flat(v, e, d)]),
    (collections.OrderedDict, lambda v, e, d: ["O", _flat(v, e, d)]),
    (collections.defaultdict, lambda v, e, d: ["D", _factory(v), _flat(v, e, d)]),
    (dict, lambda v, e, d: ["d", _flat(v, e, d)]),
    (list, lambda v, e, d: ["l", _items(v, e, d)]),
    (tuple, lambda v, e, d: _tuple(v, e, d)),
    (set, lambda v, e, d: ["s", _items(v, e, d)]),
    (frozenset, lambda v, e, d: ["f", _items(v, e, d)]),
    (collections.deque, lambda v, e, d: ["q", _items(v, e, d), v.maxlen]),
    (collections.ChainMap, lambda v, e, d: ["M", _items(v.maps, e, d)]),
    (range, lambda v, e, d: ["r", encode(v.start, e), encode(v.stop, e), encode(v.step, e)]),
)
_VIEWS = {type({}.keys()): "k", type({}.values()): "v", type({}.items()): "e"}


def decode(item, resolve, remote, depth=0):
    """The value ``item`` describes, built from the allowed types only; handles become ``remote(id, kind)`` and
    handed-back objects ``resolve(id)``. ValueError/TypeError when ``item`` describes no value."""
    kind = type(item)
    if kind in _LOOSE:
        return item
    if kind is not list or not item or type(item[0]) is not str:
        raise ValueError(f"not a value: {type(item).__name__}")
    if depth > MAX_DEPTH:
        raise ValueError(f"a value nested more than {MAX_DEPTH} deep")
    size, build = _BUILDERS.get(item[0], (0, None))
    if len(item) != size:
        raise ValueError(f"not a value: {item[0][:20]!r}")
    return build(_Parts(resolve, remote, depth + 1), *item[1:])


class _Parts:
    """Reads the parts of one tagged value, each checked for its type before anything is built of it."""

    __slots__ = ("depth", "remote", "resolve")

    def __init__(self, resolve, remote, depth):
        self.resolve, self.remote, self.depth = resolve, remote, depth

    def each(self, items):
        if type(items) is not list:
            raise ValueError("not a value")
        return [decode(x, self.resolve, self.remote, self.depth) for x in items]

    def pairs(self, flat):
        items = self.each(flat)
        if len(items) % 2:
            raise ValueError("not a value")
        return zip(items[::2], items[1::2], strict=True)

    def value(self, item):
        return decode(item, self.resolve, self.remote, self.depth)


def _text(x, limit=None):
    if type(x) is not str or (limit is not None and len(x) > limit):
        raise ValueError("not a value")
    return x


def _number(x):
    if type(x) not in (int, float):
        raise ValueError("not a value")
    return x


def _maps(parts, items):
    maps = parts.each(items)
    if not all(isinstance(m, dict) for m in maps):
        raise ValueError("not a value")
    return collections.ChainMap(*maps)


def _handle(parts, ident, kind):
    if type(ident) is not int:
        raise ValueError("not a handle")
    return parts.remote(ident, _text(kind)[:100])


def _handed_back(parts, ident):
    if type(ident) is not int:
        raise ValueError("not a handle")
    return parts.resolve(ident)


def _defaultdict(parts, factory, flat):
    if factory is not None and factory not in _FACTORIES:
        raise ValueError("not a value: a defaultdict's factory must be a builtin type")
    return collections.defaultdict(_FACTORIES.get(factory), parts.pairs(flat))


def _deque(parts, items, maxlen):
    if maxlen is not None and type(maxlen) is not int:
        raise ValueError("not a value")
    return collections.deque(parts.each(items), maxlen)


# tag -> (length of the tagged array, how to build its value from its parts)
_BUILDERS = {
    "l": (2, lambda p, xs: p.each(xs)),
    "t": (2, lambda p, xs: tuple(p.each(xs))),
    "n": (4, _named),
    "s": (2, lambda p, xs: set(p.each(xs))),
    "f": (2, lambda p, xs: frozenset(p.each(xs))),
    "d": (2, lambda p, flat: dict(p.pairs(flat))),
    "i": (2, lambda p, x: int(_text(x), 16)),
    "c": (3, lambda p, re, im: complex(_number(re), _number(im))),
    "b": (2, lambda p, x: base64.b64decode(_text(x).encode("ascii"), validate=True)),
    "y": (2, lambda p, x: bytearray(base64.b64decode(_text(x).encode("ascii"), validate=True))),
    "F": (3, lambda p, num, den: fractions.Fraction(int(_text(num), 16), int(_text(den), 16))),
    "N": (2, lambda p, x: decimal.Decimal(_text(x, 10000))),
    "C": (2, lambda p, flat: collections.Counter(dict(p.pairs(flat)))),
    "O": (2, lambda p, flat: collections.OrderedDict(p.pairs(flat))),
    "D": (3, _defaultdict),
    "q": (3, _deque),
    "M": (2, _maps),
    "r": (4, lambda p, a, b, c: range(p.value(a), p.value(b), p.value(c))),
    "k": (2, lambda p, xs: dict.fromkeys(p.each(xs)).keys()),
    "v": (2, lambda p, xs: dict(enumerate(p.each(xs))).values()),
    "e": (2, lambda p, xs: dict(p.each(xs)).items()),
    "H": (3, _handle),
    "R": (2, _handed_back),
}


def update_in_place(old, new):
    """Make ``old`` equal ``new`` without replacing it, nested containers included: what a call changed in an
    argument it was handed as data, copied back to the caller's own object."""
    if isinstance(old, list) and isinstance(new, list):
        for i in range(min(len(old), len(new))):
            if _same_container(old[i], new[i]):
                update_in_place(old[i], new[i])
            else:
                old[i] = new[i]
        del old[len(new) :]
        old.extend(new[len(old) :])
    elif isinstance(old, dict) and isinstance(new, dict):
        order = list(new)
        for key in [key for key in old if key not in new]:
            del old[key]
        for key, item in new.items():
            if key in old and _same_container(old[key], item):
                update_in_place(old[key], item)
            else:
                old[key] = item
        if list(old) != order:  # an order the completion changed (popped and re-added) is part of the answer
            items = list(old.items())
            old.clear()
            old.update(sorted(items, key=lambda pair: order.index(pair[0])))
    elif isinstance(old, set) and isinstance(new, set | frozenset):
        old.clear()
        old.update(new)
    elif isinstance(old, bytearray) and isinstance(new, bytes | bytearray):
        old[:] = new
    elif isinstance(old, collections.deque) and isinstance(new, collections.deque):
        old.clear()
        old.extend(new)
    elif isinstance(old, tuple) and isinstance(new, tuple) and len(old) == len(new):
        for mine, theirs in zip(old, new, strict=True):
            if _same_container(mine, theirs):
                update_in_place(mine, theirs)


def _same_container(old, new):
    return type(old) is type(new) and isinstance(old, list | dict | set | bytearray | collections.deque | tuple)


def mutable(item):
    """Whether an encoded argument holds something a call could change in place."""
    return type(item) is list and bool(item) and item[0] in _MUTABLE


# ----------------------------------------------------------------------------------------------- exceptions
_NOT_CARRIED = frozenset(("SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseExceptionGroup", "ExceptionGroup"))


def exception_message(error):
    """``[name, message]``: the nearest builtin exception type of ``error`` and its message."""
    name = "Exception"
    for cls in type(error).__mro__:
        if getattr(builtins, cls.__name__, None) is cls and issubclass(cls, BaseException):
            name = cls.__name__
            break
    try:
        text = str(error)
    except BaseException:
        text = "(an exception whose message cannot be shown)"
    return [name, text[:MESSAGE_CHARS] if type(text) is str else ""]


class CallFailed(BaseException):
    """A call across the wire that cannot end as an ordinary exception of the tests: the completion exited in it,
    or went away, or ran out of time. A BaseException, so that a test's ``except Exception`` cannot swallow it."""

    def __init__(self, message, why="exit"):
        BaseException.__init__(self, message)
        self.why = why


def rebuild_exception(name, text, args=None):
    """The builtin exception ``name`` with its arguments ``args`` (values), else ``text``; ``SystemExit`` and the
    like as :class:`CallFailed`."""
    if type(name) is not str or type(text) is not str:
        raise ValueError("not an exception")
    text = text[:MESSAGE_CHARS]
    if name in _NOT_CARRIED:
        return CallFailed(f"the completion raised {name} in a call: {text}")
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = Exception
    if type(args) is list and len(args) <= 8:
        with contextlib.suppress(Exception):
            return cls(*args)
    for candidate in cls.__mro__:  # UnicodeDecodeError and the like take more than a message: their base does not
        try:
            return candidate(text)
        except TypeError:
            continue
    return Exception(text)


# ------------------------------------------------------------------------------------------------- handles
class HandleError(CallFailed):
    """What the tests did with a handle that only values allow: compare, hash, truth-test it. It fails the test
    (a BaseException: no ``except TypeError`` in the tests turns a refused comparison into a pass)."""

    def __init__(self, message):
        CallFailed.__init__(self, message, "handle")


class Remote:
    """The other side's object ``_id``: calls, attributes, items, len, iteration, str and repr cross the wire;
    comparing, hashing and truth-testing it are refused (``strict``: the judge's side), since only values may be
    compared in the tests."""

    __slots__ = ("__weakref__", "_endpoint", "_id", "_kind", "_taken")
    strict = True

    def __init__(self, endpoint, ident, kind):
        object.__setattr__(self, "_endpoint", endpoint)
        object.__setattr__(self, "_id", ident)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_taken", None)  # items taken ahead when it is iterated (see __next__)

    def _ask(self, op, *args):
        return self._endpoint.request(op, self._id, *args)

    def _refuse(self, *args):
        if not self.strict:
            return NotImplemented
        raise HandleError(
            f"the completion gave a {self._kind} object, not a value: the tests compare values only (numbers, strings, "
            "containers)"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __hash__(self):
        if not self.strict:
            return object.__hash__(self)
        return self._refuse()

    def __bool__(self):
        if not self.strict:
            return True
        return self._refuse()

    def __call__(self, *args, **kwargs):
        return self._ask("call", list(args), kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __delattr__(self, name):
        self._ask("delattr", name)

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __delitem__(self, key):
        self._ask("delitem", key)

    def __len__(self):
        return self._ask("len")

    def __contains__(self, item):
        if self.strict:  # membership is a comparison: the completion's object would make it for the tests
            raise HandleError(
                f"`x in <the completion's {self._kind}>`: the tests compare values only; "
                "compare the items it gives (`x in list(...)`)"
            )
        return self._ask("contains", item)

    def __iter__(self):
        found = self._ask("iter")
        if not isinstance(found, Remote):
            raise TypeError(f"iter() of the completion's {self._kind} gave no iterator")
        if found.strict:  # the tests loop over it: its items may come ahead, in batches
            found._batches()
        return found

    def _batches(self):
        if self._taken is None:
            object.__setattr__(self, "_taken", _Taken())
        self._taken.grow = True

    def __next__(self):
        # Items cross one a call; once the tests loop over it (iter()), in growing batches (1, 2, 4 ... 4096): a long
        # iteration costs few round trips. The completion's view of the tests' iterators never takes ahead: an
        # iterator the tests hand it must stand where it left it.
        taken = self._taken
        if taken is None:
            taken = _Taken()
            object.__setattr__(self, "_taken", taken)
        if not taken.items:
            if taken.end is None:
                items, end = self._ask("take", taken.size)
                if taken.grow:
                    taken.size = min(taken.size * 2, _TAKE_MAX)
                taken.items.extend(reversed(items))
                taken.end = end
            if not taken.items:
                if taken.end == "stop" or taken.end is None:
                    raise StopIteration
                raise rebuild_exception(*taken.end)
        return taken.items.pop()

    def __str__(self):
        return self._ask("str")

    def __repr__(self):
        return self._ask("repr")

    def __format__(self, spec):
        return self._ask("format", spec)

    def __reduce_ex__(self, protocol):
        raise TypeError(f"the completion's {self._kind} object cannot be copied in the tests")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class LooseRemote(Remote):
    """The completion's view of the judge's objects: compared and hashed by identity (its own business)."""

    __slots__ = ()
    strict = False


_TAKE_MAX = 4096


class _Taken:
    """What a remote iterator has given ahead: its items (reversed, popped from the end), and how it ended."""

    __slots__ = ("end", "grow", "items", "size")

    def __init__(self):
        self.items, self.end, self.size, self.grow = [], None, 1, False


def take(iterator, size):
    """``[items, end]``: up to `size` items of `iterator`; end is None (more may follow), "stop", or the exception
    that ended it (``[name, message]``), given after the items taken before it."""
    if type(size) is not int or not 0 < size <= _TAKE_MAX:
        raise ValueError("not a size")
    items = []
    try:
        for _ in range(size):
            items.append(next(iterator))
    except StopIteration:
        return [items, "stop"]
    except BaseException as error:  # SystemExit included: it ends this iteration, not the server
        if isinstance(error, CallFailed | WireError):
            raise
        return [items, exception_message(error)]
    return [items, None]


# ----------------------------------------------------------------------------------------------- the endpoint
ALL_OPS = frozenset(
    [
        "call",
        "getattr",
        "setattr",
        "delattr",
        "getitem",
        "setitem",
        "delitem",
        "len",
        "contains",
        "iter",
        "next",
        "take",
        "str",
        "repr",
        "format",
    ]
)
# Which arguments of each operation are values (encoded); the others are names or format specs (strings).
_VALUE_ARGS = {"setattr": (1,), "getitem": (0,), "setitem": (0, 1), "delitem": (0,), "contains": (0,)}
# What the completion may do with the judge's objects (a callable, an iterator, an instance of a class the tests
# define): use them, and read the public attributes of an instance (a tree's `node.left`); never an attribute of a
# function, class or module (a function's __globals__ would be the tests' namespace).
JUDGE_OPS = frozenset(["call", "iter", "next", "take", "len", "contains", "getitem", "str", "repr", "getattr"])
_NO_ATTRIBUTES = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
    types.TracebackType,
    functools.partial,
)


def judge_guard(op, obj, payload):
    """Refuse what the completion may not do with the judge's `obj` (see JUDGE_OPS)."""
    if op not in JUDGE_OPS:
        raise TypeError("the tests' objects can only be called, iterated, measured, indexed and shown")
    if op == "getattr" and (
        not payload or type(payload[0]) is not str or payload[0].startswith("_") or isinstance(obj, _NO_ATTRIBUTES)
    ):
        raise AttributeError("only the public attributes of the tests' own instances can be read")


class Endpoint:
    """One side of the wire: requests go out and wait for their answer, serving the other side's requests that
    arrive meanwhile (a call of the tests into the completion may call back a function the tests handed it)."""

    def __init__(self, fd, deadline, remote_class, guard=None):
        self.fd, self.deadline, self.remote_class, self.guard = fd, deadline, remote_class, guard
        self.objects = {}  # id -> our object the other side holds a handle to
        self.by_identity = {}  # id(object) -> our id, so the same object keeps its handle
        self.remotes = {}  # id -> our one Remote of the other side's object (an iterator's items taken ahead)
        self.requests = 0

    # -- what we send
    def export(self, obj):
        ident = self.by_identity.get(id(obj))
        if ident is None or self.objects.get(ident) is not obj:
            ident = len(self.objects) + 1
            self.objects[ident] = obj
            self.by_identity[id(obj)] = ident
        return ["H", ident, type(obj).__name__]

    def encode(self, value):
        return encode(value, self.export)

    def resolve(self, ident):
        try:
            return self.objects[ident]
        except KeyError:
            raise ValueError("a handle to no object") from None

    def remote(self, ident, kind):
        found = self.remotes.get(ident)
        if found is None:
            found = self.remotes[ident] = self.remote_class(self, ident, kind)
        return found

    def decode(self, item):
        return decode(item, self.resolve, self.remote)

    # -- a request and its answer
    def request(self, op, target, *args):
        self.requests += 1
        number = self.requests
        originals = None
        if op == "call":
            positional, keywords = args
            items = [self.encode(a) for a in positional]
            named = [[k, self.encode(v)] for k, v in keywords.items()]
            originals = positional, keywords
            payload = [items, named]
        else:
            values = _VALUE_ARGS.get(op, ())
            payload = [self.encode(a) if i in values else a for i, a in enumerate(args)]
        try:
            send(self.fd, ["q", number, op, target, payload])
            while True:
                message = receive(self.fd, self.deadline)
                if type(message) is not list or not message or message[0] not in ("a", "x", "q"):
                    raise WireError("not a message")
                if message[0] == "q":
                    self.serve(message)
                    continue
                if len(message) < 3 or message[1] != number:
                    raise WireError("an answer to no request")
                return self._answer(message, op, originals)
        except WireError as e:  # not an exception of the tests' world: nothing may catch it there
            raise CallFailed(str(e), e.why) from None

    def _answer(self, message, op, originals):
        if message[0] == "x":
            if len(message) != 5:
                raise WireError("not an exception")
            try:
                args = self.decode(message[4]) if message[4] is not None else None
                error = rebuild_exception(message[2], message[3], args)
            except (ValueError, TypeError, ArithmeticError, RecursionError) as e:
                raise WireError(str(e)) from None
            if op != "next" and isinstance(error, StopIteration | StopAsyncIteration):
                # Only `next` may end an iteration: raised by a call, it would end the tests' own loop (an `all()`
                # over a map() of the completion's answers would pass). PEP 479 turns it into a RuntimeError too.
                error = RuntimeError(f"the completion raised {type(error).__name__} in a call: {error}")
            raise error
        if len(message) != 4:
            raise WireError("not an answer")
        try:
            value = self.decode(message[2])
            changed = message[3]
            if changed and originals is not None:
                self._copy_back(changed, originals)
        except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError) as e:
            raise CallFailed(f"the completion answered with no value: {str(e)[:200]}", "answer") from None
        return value

    def _copy_back(self, changed, originals):
        positional, keywords = originals
        if type(changed) is not list:
            raise ValueError("not a value")
        for entry in changed:
            if type(entry) is not list or len(entry) != 2:
                raise ValueError("not a value")
            where, item = entry
            if type(where) is int and 0 <= where < len(positional):
                update_in_place(positional[where], self.decode(item))
            elif type(where) is str and where in keywords:
                update_in_place(keywords[where], self.decode(item))

    # -- serving the other side
    def serve(self, message):
        """Answer one request ``["q", number, op, target, payload]``."""
        if len(message) != 5 or type(message[1]) is not int or message[2] not in ALL_OPS:
            raise WireError("not a request")
        _, number, op, target, payload = message
        try:
            if type(payload) is not list:
                raise ValueError("not a request")
            obj = self.resolve(target)
            if self.guard is not None:
                self.guard(op, obj, payload)
            result, changed = self._perform(op, obj, payload)
            answer = ["a", number, self.encode(result), changed]
        except (WireError, CallFailed):  # the wire itself failed: no answer can be sent
            raise
        except BaseException as error:  # SystemExit included: the call failed, the server goes on
            answer = ["x", number, *exception_message(error), self._arguments(error)]
        try:
            send(self.fd, answer)
        except ValueError as e:  # too large to send
            send(self.fd, ["x", number, "ValueError", str(e), None])

    def _arguments(self, error):
        """An exception's arguments as data (KeyError('x') must arrive as KeyError('x'), OSError with its errno);
        None when they are not values."""
        try:
            args = self.encode(list(error.args))
        except BaseException:
            return None
        return args if all(type(a) is not list or a[0] not in "HR" for a in args[1]) else None

    def _perform(self, op, obj, payload):
        if op == "call":
            return self._call(obj, payload)
        size, perform = _OPS[op]
        if len(payload) != size:
            raise ValueError("not a request")
        return perform(obj, self.decode, *payload), []

    def _call(self, function, payload):
        """Call `function` with the request's arguments; what it changed of them in place, to be copied back."""
        if len(payload) != 2 or type(payload[0]) is not list or type(payload[1]) is not list:
            raise ValueError("not a call")
        positional = [self.decode(a) for a in payload[0]]
        keywords = {}
        for entry in payload[1]:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str:
                raise ValueError("not a call")
            keywords[entry[0]] = self.decode(entry[1])
        result = function(*positional, **keywords)
        changed = [
            [i, after]
            for i, before in enumerate(payload[0])
            if mutable(before) and (after := self.encode(positional[i])) != before
        ]
        changed += [
            [name, after]
            for name, before in payload[1]
            if mutable(before) and (after := self.encode(keywords[name])) != before
        ]
        return result, changed

    def serve_forever(self):
        """Answer requests until the other side closes the wire."""
        while True:
            try:
                message = receive(self.fd, float("inf"))
            except WireError as e:
                if e.why == "gone":
                    return
                raise
            if type(message) is not list or not message or message[0] != "q":
                raise WireError("not a request")
            self.serve(message)


# op -> (its arguments, what it does to the object); the values among the arguments are decoded first.
_OPS = {
    "getattr": (1, lambda obj, value, name: getattr(obj, _text(name))),
    "setattr": (2, lambda obj, value, name, item: setattr(obj, _text(name), value(item))),
    "delattr": (1, lambda obj, value, name: delattr(obj, _text(name))),
    "getitem": (1, lambda obj, value, key: obj[value(key)]),
    "setitem": (2, lambda obj, value, key, item: operator.setitem(obj, value(key), value(item))),
    "delitem": (1, lambda obj, value, key: operator.delitem(obj, value(key))),
    "contains": (1, lambda obj, value, item: value(item) in obj),
    "len": (0, lambda obj, value: len(obj)),
    "iter": (0, lambda obj, value: iter(obj)),
    "next": (0, lambda obj, value: next(obj)),
    "take": (1, lambda obj, value, size: take(obj, size)),
    "str": (0, lambda obj, value: str(obj)),
    "repr": (0, lambda obj, value: repr(obj)),
    "format": (1, lambda obj, value, spec: format(obj, _text(spec))),
}
