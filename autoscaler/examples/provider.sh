#!/bin/sh
# An example gantry-autoscaler exec provider (docs/autoscaling.md, "The exec-plugin contract").
#
# The autoscaler runs this program once per request: one JSON object on stdin, one JSON object
# on stdout, exit status 0 (anything else: the request failed and stderr says why).
#
#   {"op":"create","pool":P,"count":N,"shape":{...}}  ->  {"nodes":["id",...]}   (at most N)
#   {"op":"delete","node":"id"}                        ->  {}
#   {"op":"list"}                                      ->  {"nodes":[{"id":"...","pool":"..."}]}
#
# Each node must run `gantry-agent --name <id> --resources <shape.resources>
# --attributes <shape.attributes> --master ... --tls-dir ...`: the autoscaler finds a node's
# agent by its name. Requests are compact JSON on one line (keys sorted).
#
# This example only keeps a record per node in $GANTRY_EXAMPLE_PROVIDER_STATE (a directory):
# a cloud provider replaces the three marked lines with its CLI, e.g. for a create
#   aws ec2 run-instances --instance-type ... --user-data "gantry-agent --name $id ..."
# (spot pools: --instance-market-options MarketType=spot), for a delete
#   aws ec2 terminate-instances --instance-ids "$(cat "$state/$id")"
# and for a list, the instances tagged gantry-pool=... .
set -eu
state=${GANTRY_EXAMPLE_PROVIDER_STATE:?set GANTRY_EXAMPLE_PROVIDER_STATE to a directory}
req=$(cat)
field() { printf '%s' "$req" | sed -n "s/.*\"$1\":\"\{0,1\}\([A-Za-z0-9._-]*\).*/\1/p"; }
op=$(field op)
case "$op" in
create)
    pool=$(field pool)
    count=$(field count)
    ids=""
    n=0
    while [ "$n" -lt "$count" ]; do
        seq=$(($(cat "$state/.seq" 2>/dev/null || echo 0) + 1))
        echo "$seq" > "$state/.seq"
        id="$pool-$seq"
        echo "$pool" > "$state/$id"              # <- a cloud: create the instance here
        ids="$ids${ids:+,}\"$id\""
        n=$((n + 1))
    done
    printf '{"nodes":[%s]}\n' "$ids"
    ;;
delete)
    node=$(field node)
    rm -f "$state/$node"                         # <- a cloud: terminate the instance here
    echo '{}'
    ;;
list)
    out=""
    for f in "$state"/*; do                      # <- a cloud: list the tagged instances here
        [ -f "$f" ] || continue
        out="$out${out:+,}{\"id\":\"$(basename "$f")\",\"pool\":\"$(cat "$f")\"}"
    done
    printf '{"nodes":[%s]}\n' "$out"
    ;;
*)
    echo "unknown op: $op" >&2
    exit 2
    ;;
esac
