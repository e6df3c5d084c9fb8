"""Emulated clusters on one Linux machine: network namespaces joined by tc-shaped links
(:mod:`dslide_workflows.cluster.netns`), for ``dslide bench cluster``."""
