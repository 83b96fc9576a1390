"""Whether a Kubernetes job's image can hold its recipe: a recipe from a package other than
hpcpipe needs an image with that package installed (``containers/recipe.Dockerfile``)."""

from __future__ import annotations

from hpcpipe.config import JobConfig
from hpcpipe.config.launch import K8sConfig
from hpcpipe.recipes.registry import BUILTIN_PACKAGE, package_of, recipe_class


def image_note(job: JobConfig) -> str | None:
    """One line for the user when the recipe is not hpcpipe's and ``launch.k8s.image`` is still
    hpcpipe's default image, where the pods would not find it; None otherwise."""
    cls = recipe_class(job.run.recipe)
    package = package_of(cls)
    if package == BUILTIN_PACKAGE or job.launch.k8s.image != K8sConfig.model_fields["image"].default:
        return None
    where = f"package {package}" if package else f"module {cls.__module__} (not an installed package)"
    return (
        f"note: run.recipe {job.run.recipe} comes from {where}, which hpcpipe's image lacks: build an "
        "image with it (containers/recipe.Dockerfile) and set launch.k8s.image"
    )
