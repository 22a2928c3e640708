"""The Component protocol: every service primectl runs that is not an inference engine.

etcd, the Dynamo frontend, HAProxy and Mooncake's master are components; so is
anything a plugin adds (an exporter, a gateway, a file server). A component is
one class in one module, registered as an entry point in group
`primectl.components` (primectl.registry; the built-in ones live here). The
planner asks every component, in order, for its services: those of stage
`control` before the workers are placed (workers depend on them), those of
stage `edge` after (they may depend on the workers). A component adds nothing
when its recipe block is absent or off.

Beyond `name`, `stage` and `extend`, a component may declare (ComponentParts):
- `recipe_block()`: its own top-level recipe key and model, validated with
  file:line like the rest of the recipe. A plugin's key is its entry point's
  name, so a recipe names the plugins it uses and no other plugin is imported;
- `validate(recipe)`: findings the model alone cannot see (a host name that is
  not in `hosts:`);
- `smoke_checks(plan, service)`: checks `primectl smoke` and `up` run against
  each of its services;
- `kubernetes(service)`: how a service of it appears in a DynamoGraphDeployment,
  or why it is not rendered there;
- `check_move(plan, service, was)`: what `diff` says when a change moves the
  readiness check of a service of it that reloads in place (a balancer whose
  health check names the served model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, cast

from primectl import registry
from primectl.engines.base import PlanContext

if TYPE_CHECKING:
    from primectl.errors import Finding
    from primectl.plan.model import Plan, Service
    from primectl.recipe.model import EngineBlock, Recipe

Stage = Literal["control", "edge"]


@dataclass(frozen=True)
class KubernetesForm:
    """A service as one component of a DynamoGraphDeployment."""

    component: str  # the DGD component's name
    type: str | None  # its componentType; None: the operator adds only its base env (no Dynamo ports or probes)


@dataclass(frozen=True)
class NotRendered:
    """A service the kubernetes target leaves out, and why (listed with what the render dropped)."""

    reason: str


@dataclass(frozen=True)
class ComponentCheck:
    """One smoke check of a component's service: a stable id, its display text, a body that returns the evidence
    of a pass or raises (the exception's text is the evidence of the failure)."""

    id: str
    title: str
    body: Callable[[], str]


@dataclass(frozen=True)
class CheckMove:
    """A reloading service whose readiness check moves with a change (the rollout reloads it as soon as the new
    workers have registered): why the check moves, and what clients see once it has."""

    why: str
    then: str


class Component(Protocol):
    """A service kind that is not an inference engine (see the module docstring)."""

    name: str
    stage: Stage

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """The plan's services with this component's own added: `planned` (what came before it, which it may
        annotate, as a balancer gives the replicas it fronts their drain) followed by its own."""
        ...


class ComponentParts(Protocol):
    """What a component may declare beyond the protocol; one without these members declares nothing."""

    def recipe_block(self) -> EngineBlock | None:
        """Its top-level recipe key and the model of its options (None: the recipe's own blocks configure it)."""
        ...

    def validate(self, recipe: Recipe) -> list[Finding]:
        """Problems with the recipe that its block's model cannot see."""
        ...

    def smoke_checks(self, plan: Plan, service: Service) -> list[ComponentCheck]:
        """Checks of one of its running services."""
        ...

    def kubernetes(self, service: Service) -> KubernetesForm | NotRendered:
        """How one of its services is rendered for Kubernetes."""
        ...

    def check_move(self, plan: Plan, service: Service, was: str) -> CheckMove:
        """Why a running service of it is to take a readiness check other than the one it was recorded with (`was`,
        a URL), and what clients see once it has."""
        ...


def get(name: str) -> Component:
    """The registered component called `name` (KeyError if none; registry.PluginError if a plugin's is broken or
    incomplete)."""
    obj = registry.load("component", name)
    missing = registry.missing_members(obj, Component)
    if missing:
        raise registry.PluginError("component", name, (
            f"component {name!r} lacks {', '.join(missing)} of the Component protocol "
            f"(primectl.components.base.Component; {registry.entry('component', name).describe()})"))
    if obj.stage not in ("control", "edge"):
        raise registry.PluginError("component", name, (
            f"component {name!r} has stage {obj.stage!r}; allowed: control, edge "
            f"({registry.entry('component', name).describe()})"))
    return cast(Component, obj)


def used_by(keys: list[str] | set[str]) -> list[str]:
    """The components a recipe with these top-level keys uses: every built-in one, and each plugin named by a key."""
    plugins = [k for k in keys if k not in registry.BUILTIN_COMPONENTS and registry.known("component", k)]
    return [*registry.BUILTIN_COMPONENTS, *sorted(plugins)]


def in_recipe(recipe: Recipe) -> list[Component]:
    """The components `recipe` uses, in planning order (built-in ones first): a plugin's block is a field of the
    recipe's model only where the recipe names it (planner/load.py)."""
    from primectl.recipe.model import Recipe as Base

    return [get(name) for name in used_by([k for k in type(recipe).model_fields if k not in Base.model_fields])]


def recipe_block(component: object) -> EngineBlock | None:
    """The component's own recipe block, None if it declares none."""
    declared = getattr(component, "recipe_block", None)
    return cast(ComponentParts, component).recipe_block() if callable(declared) else None


def validate(component: object, recipe: Recipe) -> list[Finding]:
    """The component's own findings about `recipe` (none if it declares no `validate`)."""
    declared = getattr(component, "validate", None)
    return cast(ComponentParts, component).validate(recipe) if callable(declared) else []


def smoke_checks(component: object, plan: Plan, service: Service) -> list[ComponentCheck]:
    """The component's checks of `service` (none if it declares no `smoke_checks`)."""
    declared = getattr(component, "smoke_checks", None)
    return cast(ComponentParts, component).smoke_checks(plan, service) if callable(declared) else []


def kubernetes(component: object, service: Service) -> KubernetesForm | NotRendered:
    """How `service` is rendered for Kubernetes: what its component says, else not rendered."""
    declared = getattr(component, "kubernetes", None)
    if callable(declared):
        return cast(ComponentParts, component).kubernetes(service)
    return NotRendered(f"component {getattr(component, 'name', '?')} declares no Kubernetes form")


def check_move(component: object | None, plan: Plan, service: Service, was: str) -> CheckMove:
    """What the component says of a service of it whose readiness check moves; one that says nothing loses nothing."""
    declared = getattr(component, "check_move", None)
    if callable(declared):
        return cast(ComponentParts, component).check_move(plan, service, was)
    return CheckMove("its readiness check moves", "expected loss 0")
