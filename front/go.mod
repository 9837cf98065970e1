module shadowab/front

go 1.22
