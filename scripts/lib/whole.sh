# A positive-integer argument check for scripts that check their arguments before they start
# anything (sourced; it only defines the function, so it may come before scripts/nodes.sh,
# which makes a directory):
#   whole_number SCRIPT NAME VALUE MIN   returns when VALUE is a whole number from MIN up; else
#                                        says "SCRIPT: NAME must be a whole number from MIN up,
#                                        not 'VALUE'" on stderr and exits with status 2
whole_number() {
    [[ $3 =~ ^[0-9]+$ ]] && [ "$3" -ge "$4" ] ||
        { echo "$1: $2 must be a whole number from $4 up, not '$3'" >&2; exit 2; }
}
