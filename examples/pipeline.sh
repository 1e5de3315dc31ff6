#!/usr/bin/env bash
# mlxpa inside a shell pipeline: rows in on stdin, results out on stdout (in input order),
# progress on stderr. Labels the sentiment of every review in a text file (one per line) and
# prints "label<TAB>review". Every prompt starts with the same four labelled reviews (a
# few-shot prefix the 270M base model completes well), so after the first row that prefix
# comes from the prefix cache. Needs jq.
#   examples/pipeline.sh examples/reviews.txt
set -euo pipefail
reviews=${1:-"$(dirname "$0")/reviews.txt"}
shots='Label the sentiment of each review as positive or negative.

Review: The battery lasts two full days and the screen is gorgeous.
Sentiment: positive

Review: It broke after a week and support never answered my emails.
Sentiment: negative

Review: Delivery was fast and it works perfectly.
Sentiment: positive

Review: The soup was cold and the waiter was rude.
Sentiment: negative

'

jq -R -c --arg shots "$shots" '{prompt: ($shots + "Review: " + . + "\nSentiment:")}' "$reviews" \
  | mlxpa run - --max-tokens 2 --stop $'\n' --quiet \
  | jq -r '.text | ltrimstr(" ")' \
  | paste - "$reviews"
