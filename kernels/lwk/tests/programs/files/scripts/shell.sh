# Run by busybox sh in the differential tests (tests/busybox-commands.txt): pipelines, command
# substitution, a loop with if, xargs, and the exit statuses of children.
echo one two three | tr a-z A-Z | tr ' ' '\n'
words=$(echo sub; echo stitution)
echo "substituted: $words"
echo "nested: $(echo $(echo inner) outer)"
i=0
while [ $i -lt 4 ]; do
    if [ $((i % 2)) -eq 0 ]; then echo "$i even"; else echo "$i odd"; fi
    i=$((i + 1))
done
printf '%s\n' b c a | sort | xargs echo sorted:
echo a b c | xargs -n 1 echo item
false
echo "false: $?"
sh -c 'exit 3'
echo "exit 3: $?"
sh -c 'kill -TERM $$'
echo "killed by SIGTERM: $?"
if grep -q line files/input.txt; then echo "grep found a line"; fi
wc -l < files/input.txt
exit 4
