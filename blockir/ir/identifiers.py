"""Declaration names that cannot become submodule or parameter names of a compiled module.

A declaration is registered at its declared (dotted) path, so that ``state_dict()`` keys are
the declared names. A path part that is already an attribute of the module it would be
registered on (``forward``, ``training``, ``to``…) cannot be a submodule there, and a Python
keyword cannot be written as an attribute in generated code. Values and inputs are not
limited: the fx lowering renames them freely, since they never become keys.

The lists are those of torch 2.x (``tests/test_names_and_inputs.py`` checks them against
the installed torch); they are spelled out so that checking a program never imports torch.
"""
from __future__ import annotations

import keyword

# attributes of every torch.nn.Module: the owner of a dotted path's later parts
MODULE_ATTRIBUTES = frozenset("""
T_destination _apply _backward_hooks _backward_pre_hooks _buffers _call_impl _compiled_call_impl
_forward_hooks _forward_hooks_always_called _forward_hooks_with_kwargs _forward_pre_hooks
_forward_pre_hooks_with_kwargs _get_backward_hooks _get_backward_pre_hooks _get_name _is_full_backward_hook
_load_from_state_dict _load_state_dict_post_hooks _load_state_dict_pre_hooks _maybe_warn_non_full_backward_hook
_modules _named_members _non_persistent_buffers_set _parameters _register_load_state_dict_pre_hook
_register_state_dict_hook _replicate_for_data_parallel _save_to_state_dict _slow_forward _state_dict_hooks
_state_dict_pre_hooks _version _wrapped_call_impl add_module apply bfloat16 buffers call_super_init children
compile cpu cuda double dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter
get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
named_parameters parameters register_backward_hook register_buffer register_forward_hook
register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module register_parameter
register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule
share_memory state_dict to to_empty train training type xpu zero_grad
""".split())

# attributes a compiled block adds (torch.fx.GraphModule's and blockir's): the owner of a first part
BLOCK_ATTRIBUTES = MODULE_ATTRIBUTES | frozenset("""
_boxed_call _code _create_node_hooks _deepcopy_hooks _deepcopy_init _erase_node_hooks _graph _lineno_map
_prologue_start _recompile_submodules _register_create_node_hook _register_deepcopy_hook
_register_erase_node_hook _register_replace_node_hook _replace_hooks _set_replace_hook _tracer_cls
_tracer_extras _unregister_create_node_hook _unregister_deepcopy_hook _unregister_erase_node_hook
_unregister_replace_node_hook _wrapped_call add_submodule code delete_all_unused_submodules delete_submodule
graph meta print_readable recompile shape_env to_folder
""".split()) | frozenset(n for n in ("blockir_block", "blockir_contract", "blockir_context", "blockir_layer",
                                     "blockir_values", "_blockir_owns_graph",
                                     "_blockir_private_class", "_blockir_shared",
                                     # what a compiled root records of its source (blockir/lower/declared.py)
                                     "blockir_axes", "blockir_results", "blockir_span", "blockir_init",
                                     "blockir_facts", "blockir_dropped", "blockir_depth"))


def reserved_part(part: str, first: bool) -> str | None:
    """Why one part of a declaration's dotted name cannot be an attribute, or None."""
    if keyword.iskeyword(part):
        return "a Python keyword"
    if len(part) > 4 and part.startswith("__") and part.endswith("__"):
        return "a Python special name"
    if part in (BLOCK_ATTRIBUTES if first else MODULE_ATTRIBUTES):
        owner = "a compiled block (a torch.fx.GraphModule)" if part not in MODULE_ATTRIBUTES else "torch.nn.Module"
        return f"an attribute of {owner}"
    return None


def reserved_declaration(name: str) -> str | None:
    """Why declaration ``name`` cannot be registered at its path, or None when it can."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        why = reserved_part(part, first=i == 0)
        if why is not None:
            return f"has the part '{part}', which is {why}" if len(parts) > 1 else f"is {why}"
    return None
