"""`static_files:`: a static file server beside a deployment, as an out-of-tree primectl component.

One module and one entry point (group `primectl.components`, name `static_files`, the recipe key it reads), with
no edit in primectl/. With this distribution installed, a recipe may say

    static_files:
      host: head
      port: 8900
      files:
        robots.txt: "User-agent: *\\nDisallow: /\\n"

and primectl validates the block (file:line), plans a `static-files` service on that host, ships the files in
its bundle, starts Python's http.server on them with the host runtime's interpreter, waits for it to answer,
smoke-tests that it serves each file as written, and says on Kubernetes that it is not rendered.
"""

from __future__ import annotations

import urllib.request

from pydantic import BaseModel, ConfigDict, Field

from primectl.components.base import ComponentCheck, NotRendered
from primectl.engines.base import PlanContext
from primectl.errors import Finding
from primectl.plan.model import RELEASE, FileSpec, Plan, Probe, Service
from primectl.recipe.model import Recipe

KEY = "static_files"
ROOT = "static"


class StaticFilesBlock(BaseModel):
    """The recipe's `static_files:` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(..., description="The host (one of `hosts:`) that serves the files.")
    port: int = Field(8900, ge=1024, le=65535, description="The HTTP port it listens on.")
    files: dict[str, str] = Field(default_factory=dict, description="File name -> its content.")


class StaticFiles:
    """The component: one `static-files` service when the recipe has the block."""

    name = KEY
    stage = "edge"

    def recipe_block(self) -> tuple[str, type[BaseModel]]:
        """Its block, under its own name."""
        return KEY, StaticFilesBlock

    def validate(self, recipe: Recipe) -> list[Finding]:
        """The host must be one of the recipe's; file names plain names."""
        block = getattr(recipe, KEY, None)
        if block is None:
            return []
        hosts = [h.name for h in recipe.host_list()]
        out = []
        if block.host not in hosts:
            out.append(Finding((KEY, "host"), f"{block.host!r} is not a host of this recipe; allowed: {', '.join(hosts)}"))
        out += [Finding((KEY, "files", name), "a file name is one path segment (no `/`, not `.` or `..`)")
                for name in block.files if "/" in name or name in ("", ".", "..")]
        return out

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """The file server, after everything else."""
        block = getattr(ctx.recipe, KEY, None)
        if block is None:
            return planned
        addr = ctx.hosts[block.host].address
        svc = Service(
            name="static-files", role="auxiliary", component=KEY, host=block.host, address=addr,
            argv=[ctx.python(block.host), "-m", "http.server", "--bind", addr, "--directory", f"{RELEASE}/{ROOT}",
                  str(block.port)],
            files=[FileSpec(path=f"{ROOT}/{name}", content=content) for name, content in sorted(block.files.items())],
            ports={"http": block.port}, listens=[block.port],
            ready=Probe(kind="http", url=f"http://{addr}:{block.port}/", timeout_s=30),
        )
        return [*planned, svc]

    def smoke_checks(self, plan: Plan, service: Service) -> list[ComponentCheck]:
        """Each file is served as written."""
        base = f"http://{service.address}:{service.ports['http']}"
        expected = {f.path.removeprefix(f"{ROOT}/"): f.content for f in service.files}

        def serves() -> str:
            for name, content in expected.items():
                with urllib.request.urlopen(f"{base}/{name}", timeout=5) as resp:
                    got = resp.read().decode()
                if got != content:
                    raise AssertionError(f"{base}/{name} served {len(got)} bytes that differ from the recipe's")
            return f"{len(expected)} file(s) served as written at {base}"

        return [ComponentCheck("serves", "serves every file as written", serves)]

    def kubernetes(self, service: Service) -> NotRendered:
        """Not rendered: a ConfigMap and a Service would do; this example does not write them."""
        return NotRendered("the static_files example component has no Kubernetes form")
