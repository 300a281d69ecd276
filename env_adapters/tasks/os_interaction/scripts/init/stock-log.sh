#!/bin/bash
# Writes /usr/stock.log: 401 random trades "NAME | ACTION | STOCK_INDEX | COUNT" (AgentBench's init script
# of this name is not vendored; this is an equivalent written for this project).
names=(Alice Bob)
actions=(Purchase Sell)
for ((i = 0; i < 401; i++)); do
  echo "${names[RANDOM % 2]} | ${actions[RANDOM % 2]} | $((RANDOM % 100)) | $((RANDOM % 1000))"
done > /usr/stock.log
