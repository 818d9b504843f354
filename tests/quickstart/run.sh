#!/usr/bin/env bash
# Quick start: the whole provisioning lifecycle on one machine, no cluster.
#
# Starts the in-repo Kubernetes API test server (with its controller-manager
# helpers, which bind claims and release volumes), the hostpath CSI driver and
# the real csi-provisioner; creates three claims with kubectl; shows them
# provisioned; deletes them; shows the driver's backend empty again.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v kubectl >/dev/null 2>&1; then
  echo "kubectl is needed as the client of the quick start (it talks to the bundled API server)." >&2
  exit 1
fi

echo "==> building csi-provisioner, csi-hostpath and kube-testserver"
cargo build --quiet --locked -p csi-provisioner -p csi-hostpath -p kube-testserver
bin=target/debug

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

export KUBECONFIG="$work/kubeconfig"
"$bin/kube-testserver" --controller-manager --kubeconfig-out "$KUBECONFIG" >"$work/apiserver.log" 2>&1 &
pids+=($!)
"$bin/csi-hostpath" --endpoint "unix://$work/csi.sock" --nodeid node-1 --statedir "$work/backend" >"$work/driver.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -s "$KUBECONFIG" ] && break; sleep 0.1; done

echo "==> API server: $(head -1 "$work/apiserver.log")"
kubectl apply -f tests/quickstart/cluster.yaml

NAMESPACE=default "$bin/csi-provisioner" --csi-address "$work/csi.sock" --kubeconfig "$KUBECONFIG" \
  --retry-interval-start=200ms >"$work/provisioner.log" 2>&1 &
pids+=($!)

echo "==> creating claims"
kubectl apply -f tests/quickstart/claims.yaml

wait_for() { # description, command...
  local what=$1; shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for $what; provisioner log:" >&2
  cat "$work/provisioner.log" >&2
  exit 1
}
bound() { [ "$(kubectl get pvc -n default -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c Bound)" = 3 ]; }
wait_for "3 claims bound" bound

echo "==> provisioned"
kubectl get pvc -n default -o custom-columns=NAME:.metadata.name,STATUS:.status.phase,VOLUME:.spec.volumeName,CAPACITY:.status.capacity.storage,CLASS:.spec.storageClassName
kubectl get pv -o custom-columns=NAME:.metadata.name,CAPACITY:.spec.capacity.storage,MODE:.spec.volumeMode,CLAIM:.spec.claimRef.name,HANDLE:.spec.csi.volumeHandle,FINALIZERS:.metadata.finalizers
echo "==> backend volumes of the driver"
ls "$work/backend/volumes" | grep -v '\.json$' || true
kubectl get events -n default --field-selector reason=ProvisioningSucceeded -o custom-columns=OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message

echo "==> deleting the claims"
kubectl delete pvc -n default --all --wait=false
gone() { [ -z "$(kubectl get pv -o name)" ] && [ -z "$(ls "$work/backend/volumes" 2>/dev/null)" ]; }
wait_for "PVs and backend volumes deleted" gone
echo "==> after deletion"
kubectl get pv
echo "backend volumes left: $(ls "$work/backend/volumes" | wc -l)"
echo "==> done: claims provisioned by CreateVolume and cleaned up by DeleteVolume"
