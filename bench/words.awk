# bench/hot_streams.sh: word frequencies of generated text, file by file:
# each file's words counted from an empty table, then its top three, so
# that k files given are k times the same unit of work (with one table for
# all, the first file inserts every word and the others only count them:
# a complete trace of one file was not the work of the long run).
{ for (i = 1; i <= NF; i++) { w = tolower($i); gsub(/[^a-z]/, "", w); if (w != "") count[w]++ } }
ENDFILE {
    n = 0
    for (w in count) { n++; keys[n] = count[w] " " w }
    m = asort(keys, sorted, "@val_num_desc")
    for (i = 1; i <= 3 && i <= m; i++) print FILENAME ": " sorted[i]
    delete count; delete keys; delete sorted
}
