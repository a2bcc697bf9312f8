"""State tuples passed by pointer inside the jitted loops.

The engine's state is NamedTuples of numpy arrays: easy to build, read and test from Python. But
numba passes a NamedTuple argument by value, flattened into the fields of its arrays, so a call
that hands on the memory state (a few hundred arrays) moves thousands of words: about a
microsecond a call even when the callee does nothing (measured: 7.7 us for one sub-core's
scheduler cycle with the tuples, 0.25 us with pointers).

``as_ptr(state)`` lays a NamedTuple's fields out in a struct on the caller's stack (recursively:
NamedTuple fields become pointers too) and returns a ``StatePtr`` to it: one word to pass, the
same attribute syntax, the same arrays (every write lands where the Python side sees it). The
run loops convert their arguments once at entry and call the loop body with the pointers, so the
pointers never outlive the frame that holds the structs. Every engine function is written against
attribute access only, so it compiles for either form; block tests call them with the NamedTuples.
No reference counting is involved: the fields are borrowed from the tuples the caller holds.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models
from numba.core.imputils import impl_ret_borrowed
from numba.core.typing.templates import AttributeTemplate
from numba.extending import infer_getattr, intrinsic, lower_getattr_generic, register_model

from archsim.engine.jit import njit


class StatePtr(types.Type):
    """A borrowed pointer to a struct holding the fields of one state NamedTuple."""

    def __init__(self, fields):
        self.fields = tuple(fields)
        self.field_dict = dict(self.fields)
        self.index = {n: i for i, (n, _) in enumerate(self.fields)}
        super().__init__(name="StatePtr(" + ", ".join(f"{n}: {t}" for n, t in self.fields) + ")")


@register_model(StatePtr)
class _StatePtrModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        struct = ir.LiteralStructType([dmm.lookup(t).get_data_type() for _, t in fe_type.fields])
        super().__init__(dmm, fe_type, struct.as_pointer())


@infer_getattr
class _StatePtrAttributes(AttributeTemplate):
    key = StatePtr

    def generic_resolve(self, typ, attr):
        return typ.field_dict.get(attr)


@lower_getattr_generic(StatePtr)
def _getattr(context, builder, typ, val, attr):
    fty = typ.field_dict[attr]
    ptr = cgutils.gep_inbounds(builder, val, 0, typ.index[attr])
    v = context.data_model_manager[fty].load_from_data_pointer(builder, ptr)
    return impl_ret_borrowed(context, builder, fty, v)


def ptr_type(ty):
    """The StatePtr type for a NamedTuple type (other types as they are)."""
    if isinstance(ty, types.BaseNamedTuple):
        return StatePtr(tuple((n, ptr_type(t)) for n, t in zip(ty.fields, ty.types)))
    return ty


def _build(context, builder, ty, val):
    pty = ptr_type(ty)
    ptr = cgutils.alloca_once(builder, context.data_model_manager[pty].get_value_type().pointee)
    for i, fty in enumerate(ty.types):
        fv = builder.extract_value(val, i)
        if isinstance(fty, types.BaseNamedTuple):
            fv = _build(context, builder, fty, fv)
            fty = ptr_type(fty)
        builder.store(context.data_model_manager[fty].as_data(builder, fv),
                      cgutils.gep_inbounds(builder, ptr, 0, i))
    return ptr


@intrinsic
def as_ptr(typingctx, state):
    """A StatePtr to the fields of a state NamedTuple, valid while the calling frame lives."""
    if not isinstance(state, types.BaseNamedTuple):
        return None

    def codegen(context, builder, sig, args):
        return _build(context, builder, sig.args[0], args[0])

    return ptr_type(state)(state), codegen


@njit(cache=True)
def with_ptr(fn, state, *args):
    """``fn(as_ptr(state), *args)`` from Python, for block tests that call one engine function on
    a state NamedTuple. A jitted function compiled for the NamedTuple itself takes it flattened,
    every array of it in every call down the tree, which compiles several times slower than the
    same tree on the pointer (see CHANGELOG)."""
    return fn(as_ptr(state), *args)
