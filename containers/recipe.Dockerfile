# A team's own recipe package on top of hpcpipe's image (containers/Dockerfile), for
# `hpcpipe launch k8s` / `helm-values` / `kfp` (set launch.k8s.image to the result) and for Slurm
# nodes that run containers. Build it from the package's directory (the one with pyproject.toml
# and the `hpcpipe.recipes` entry point; `hpcpipe new recipe NAME` writes one):
#
#   docker build -f /path/to/hpcpipe/containers/recipe.Dockerfile \
#     --build-arg HPCPIPE_IMAGE=registry.example.com/hpcpipe/hpcpipe:0.1.0 --build-arg RECIPE=my-recipe \
#     -t registry.example.com/team/my-recipe:0.1.0 path/to/my-recipe
#
# The package's own dependencies are installed with it; hpcpipe, torch and the rest are the base
# image's. The last step fails the build when hpcpipe cannot find the recipe in the image.
ARG HPCPIPE_IMAGE=registry.example.com/hpcpipe/hpcpipe:0.1.0
FROM ${HPCPIPE_IMAGE}
ARG RECIPE
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0
COPY . /opt/recipe
RUN uv pip install --system --no-cache /opt/recipe
USER 1000
RUN hpcpipe recipes list && hpcpipe recipes show "${RECIPE:?pass --build-arg RECIPE=<its name>}" > /dev/null
