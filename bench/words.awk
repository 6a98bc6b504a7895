# bench/hot_streams.sh: word frequencies of generated text, then the top ten.
BEGIN { srand(7) }
{ for (i = 1; i <= NF; i++) { w = tolower($i); gsub(/[^a-z]/, "", w); if (w != "") count[w]++ } }
END { n = 0; for (w in count) { n++; keys[n] = count[w] " " w }; m = asort(keys, sorted, "@val_num_desc"); for (i = 1; i <= 10 && i <= m; i++) print sorted[i] }
