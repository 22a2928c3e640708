"""primectl: declarative deployment of disaggregated LLM serving on bare-metal GPU racks."""

__version__ = "0.1.0"
