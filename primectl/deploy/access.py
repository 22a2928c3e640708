"""The SSH target's own host fields: how it reaches each host, and which host keys it trusts.

The Plan's hosts are generic (name, address, workdir, GPUs, labels). How the
SSH target logs in to one (SSHAccess: `connection`, `port`, `user`,
`identity_file`, and the head node it is reached through, `via`) is kept as
plain data under the host's `access`; the known_hosts file it checks host keys
against (SSHOptions) under the plan's `target.options`. The recipe's `hosts:`
entries are where both come from (`with_access`, `ssh_options`).

A host is recorded on the hosts (state.json's roster) and sent to the
connection keeper with these fields beside the generic ones, as every primectl
has written it (`record`): an older primectl reads what a newer one recorded,
and HostPlan reads either form back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primectl.errors import DeployError
from primectl.plan.model import HostPlan, Plan
from primectl.recipe.model import Host


class SSHAccess(BaseModel):
    """How the SSH target reaches one host (HostPlan.access)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connection: Literal["ssh", "local"] = Field(..., description="`local`: run on this machine without SSH.")
    port: int
    user: str
    identity_file: str | None
    via: HostPlan | None = Field(None, description="The host this one is reached through (its `ssh` client).")
    via_identity_file: str | None = Field(None, description="The key, on `via`, its ssh client logs in with.")

    def plain(self) -> dict[str, Any]:
        """As HostPlan.access holds it (a host reached directly names no `via`)."""
        return self.model_dump(mode="json", exclude={"via", "via_identity_file"} if self.via is None else set())


class SSHOptions(BaseModel):
    """The SSH target's plan-wide options (Plan.target.options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    known_hosts: str | None = Field(None, description="known_hosts file for SSH host keys (None: ~/.ssh/known_hosts).")


def access(host: HostPlan) -> SSHAccess:
    """How the SSH target reaches `host` (DeployError when the host was planned for a target that does not)."""
    try:
        return SSHAccess.model_validate(host.access)
    except ValidationError as exc:
        raise DeployError(f"host {host.name} has no SSH access planned ({exc.error_count()} problem(s) in its "
                          f"`access`: {host.access}); plan it for target ssh") from None


def ssh_options(plan: Plan) -> SSHOptions:
    """The plan's SSH options."""
    return SSHOptions.model_validate(plan.target.options)


def with_access(hosts: Sequence[HostPlan], specs: Sequence[Host]) -> list[HostPlan]:
    """The planned hosts with the SSH access their recipe entries give (a host reached through another carries
    that host, with its own access)."""
    spec = {s.name: s for s in specs}
    direct = {h.name: h.model_copy(update={"access": SSHAccess(
        connection=spec[h.name].connection, port=spec[h.name].port, user=spec[h.name].user,
        identity_file=spec[h.name].identity_file).plain()}) for h in hosts}

    def reached(h: HostPlan) -> HostPlan:
        via = spec[h.name].via
        if via is None:
            return h
        a = access(h).model_copy(update={"via": direct[via], "via_identity_file": spec[h.name].via_identity_file})
        return h.model_copy(update={"access": a.plain()})

    return [reached(direct[h.name]) for h in hosts]


def record(host: HostPlan) -> dict[str, Any]:
    """The host as the roster in state.json and a keeper request carry it: its access fields beside its own, in the
    order primectl has always written them."""
    a = access(host)
    out: dict[str, Any] = {"name": host.name, "address": host.address, "port": a.port, "user": a.user,
                           "identity_file": a.identity_file, "connection": a.connection, "workdir": host.workdir,
                           "gpus": host.gpus, "labels": dict(host.labels)}
    if a.via is not None:
        out |= {"via": record(a.via), "via_identity_file": a.via_identity_file}
    return out
