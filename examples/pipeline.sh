#!/usr/bin/env bash
# mlxpa inside a shell pipeline: rows in on stdin, results out on stdout (in input order),
# progress on stderr. Labels the sentiment of every review in a text file (one per line) and
# prints "label<TAB>review". Needs jq.
#   examples/pipeline.sh examples/reviews.txt
set -euo pipefail
reviews=${1:-"$(dirname "$0")/reviews.txt"}

jq -R -c '{prompt: ("Classify the sentiment of the review as positive or negative.\nReview: "
                    + . + "\nSentiment:")}' "$reviews" \
  | mlxpa run - --max-tokens 4 --stop $'\n' --quiet \
  | jq -r '.text | ltrimstr(" ")' \
  | paste - "$reviews"
