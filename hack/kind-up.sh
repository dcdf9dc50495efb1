#!/usr/bin/env bash
# A kind cluster running toposlice on fake hardware: builds the image, loads it into kind,
# installs charts/toposlice with values-fake.yaml (every node publishes a fake DGX H100)
# and prints the published slices. Needs docker, kind, kubectl and helm.
#
#   hack/kind-up.sh [CLUSTER]            default CLUSTER: toposlice
#
# Environment: KIND_NODE_IMAGE (default kindest/node:v1.34.0; DRA's resource.k8s.io/v1 is on
# by default from 1.34), NAMESPACE (default toposlice). Remove with: kind delete cluster --name CLUSTER
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${1:-${KIND_CLUSTER:-toposlice}}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}
namespace=${NAMESPACE:-toposlice}
image=toposlice:dev

for tool in docker kind kubectl helm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "kind-up: $tool not found on PATH" >&2
    exit 1
  fi
done

hack/build-image.sh "$image"

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --image "$node_image" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
KIND
fi
kubectl config use-context "kind-$cluster" >/dev/null
kind load docker-image "$image" --name "$cluster"

# hostPath mounts need the privileged Pod Security level in the driver's namespace.
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace "$namespace" pod-security.kubernetes.io/enforce=privileged --overwrite

helm upgrade --install toposlice charts/toposlice --namespace "$namespace" \
  --values charts/toposlice/values-fake.yaml --wait --timeout 5m

kubectl get deviceclasses
kubectl get resourceslices --field-selector spec.driver=toposlice.dev
echo "kind-up: ready. Try a claim: kubectl apply -f examples/gpus-nvlink-domain.yaml"
